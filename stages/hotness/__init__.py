"""Hotness stage: pre-sample, count feature-row requests, and plan each rank's cache."""
