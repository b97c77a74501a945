"""Features stage: per-partition Zarr stores of x, y and split lids."""
