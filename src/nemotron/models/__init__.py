"""Build, load and save the models of a run: the policy, the reward model, the critic, and the tokenizer; the prompts
that fit a model's positions (`prompts`), their lengths in the policy's tokens (`prompt_lengths`, torch-free) and the
tensor batches it trains on (`batches`)."""
