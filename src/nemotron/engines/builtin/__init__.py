"""The built-in engine: our own torch trainers, run as the step's own process (`engine.py`)."""
