"""Engines: each turns a compiled step config into the commands, files and outputs of one run."""
