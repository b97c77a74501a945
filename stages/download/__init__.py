"""Download stage: dataset sources (synthetic, OGB, the user's .npy files) → a canonical ``storage.graph.Graph``."""
