"""The servers' Prometheus metrics: prometheus_client owns them and their exposition (GET /metrics).

Each server gets its own `CollectorRegistry`, never the process-global one, so two servers in one process (the
tests, a step with a sibling) keep separate counts. `parse_samples` reads an exposition back with the
library's own parser, for the tests and the benchmark.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def exposition(registry: CollectorRegistry) -> bytes:
    """The body of GET /metrics: the registry in the Prometheus text format."""
    return generate_latest(registry)


def _bound(text: str) -> str:
    """A bucket's `le` as the tests spell it: "1" rather than "1.0", "+Inf" as is."""
    value = float(text)
    return text if math.isinf(value) or not value.is_integer() else str(int(value))


def parse_samples(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{label="value",...}': value}, labels sorted by name."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: (_bound(v) if k == "le" else v) for k, v in sample.labels.items()}
            rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            samples[f"{sample.name}{{{rendered}}}" if rendered else sample.name] = float(sample.value)
    return samples
