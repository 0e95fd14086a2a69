"""Engines: who trains a compiled Job. One folder per engine (builtin/, nemo_rl/, nemo_aligner/, nemo/), each an
`engine.py` class behind `Engine` and its own compilers, chosen by the config's `backend`. Their registry
(`ENGINES`) and the traits the centre asks of an engine without loading it are in nemotron.config.backends, so no
module outside the registries compares engine names."""
