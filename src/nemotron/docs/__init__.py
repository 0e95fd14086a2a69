"""The docs that come from code: the generated reference pages and figure tables (`generate`, `python -m
nemotron.docs.generate`), and the pages' runnable blocks, run and checked against what they print (`blocks`)."""
