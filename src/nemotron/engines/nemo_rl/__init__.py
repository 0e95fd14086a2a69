"""The NeMo-RL engine: the engine class (`engine.py`), its config compiler (`config.py`, from the per-step
compilers of `steps.py`, the sections of `sections.py`, and eval/policy's entry in `evaluation.py`), and the turning
of NeMo-RL's eval output into our eval_report (`evaluation_report.py`)."""
