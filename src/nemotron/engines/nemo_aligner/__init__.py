"""The NeMo-Aligner engine: the engine class (`engine.py`) and its per-step config compilers (`config.py`)."""
