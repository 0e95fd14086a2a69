"""Experiment trackers (MLflow, Weights & Biases) fed from every engine: docs/tracking.md."""
