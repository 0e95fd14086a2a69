"""The NeMo engine: checkpoint conversion between Hugging Face and .nemo by NeMo's own scripts (`engine.py`)."""
