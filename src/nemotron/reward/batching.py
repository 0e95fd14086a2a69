"""The batching settings of the reward server's dynamic batcher, and their rules, on their own: what the rm/serve
schema imports on the CLI's start-up path (the batcher itself brings prometheus_client and threads)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchingConfig:
    """How the batcher fills a batch (nemotron.reward.batcher): its rules hold whatever builds one, the rm/serve
    schema (so a config that breaks them is refused before a job is written) or the server command's flags."""

    max_batch_size: int = 64
    preferred_batch_size: int = 32
    max_queue_delay_ms: float = 5.0
    max_queue_rows: int = 65536

    def __post_init__(self) -> None:
        """Every rule the settings break, in one ValueError."""
        problems = []
        if self.max_batch_size < 1:
            problems.append(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 1 <= self.preferred_batch_size <= self.max_batch_size:
            problems.append(
                f"preferred_batch_size must be in [1, max_batch_size={self.max_batch_size}], "
                f"got {self.preferred_batch_size}"
            )
        if self.max_queue_delay_ms < 0:
            problems.append(f"max_queue_delay_ms must be >= 0, got {self.max_queue_delay_ms}")
        if self.max_queue_rows < self.max_batch_size:
            problems.append(
                f"max_queue_rows must be at least max_batch_size={self.max_batch_size}, got {self.max_queue_rows}"
            )
        if problems:
            raise ValueError("; ".join(problems))
