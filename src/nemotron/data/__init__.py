"""Data for the steps: record schemas and validating JSONL readers and writers, torch-free (the tensors made from
them are the models' concern: `nemotron.models.batches`)."""
