"""Config schema of rm/serve: a reward model behind a KServe v2 (Triton-compatible) HTTP server."""

from typing import Literal, Self

from pydantic import Field, model_validator

from nemotron.config.stepconfig import ResourcePlan, ServerBind, ServeRuntime, Strict
from nemotron.config.workload import Serving, Workload
from nemotron.reward.batching import BatchingConfig


class Inputs(Strict):
    """The model to serve: an artifact reference or a path."""

    reward_model: str | None = None
    """reward_model_hf (or, for mode=chat, a causal LM checkpoint_hf)"""


class Server(ServerBind):
    """The HTTP server: KServe v2 (Triton's protocol) for mode=reward, OpenAI chat completions for
    mode=chat."""

    mode: Literal["reward", "chat"] = "reward"
    """reward: score sequences with a reward model (KServe v2); chat: an OpenAI-compatible
    /v1/chat/completions judge from a causal LM"""
    model_name: str = "reward_model"
    """the model name clients use (/v2/models/<name>/infer; the chat request's model)"""
    max_batch_size: int = Field(64, ge=1)
    """reward: the most sequences in one forward pass; a batch takes at most preferred_batch_size from each
    request, so it passes preferred_batch_size (up to this) only when several requests share it"""
    preferred_batch_size: int = Field(64, ge=1)
    """reward: the batcher runs as soon as this many sequences wait, and takes at most this many from any one
    request per forward pass, the requests with the fewest sequences scored so far first: a large request is
    scored a slice at a time, and others' sequences go between its slices. At most max_batch_size (Triton:
    preferred_batch_size)"""
    max_queue_delay_ms: float = Field(5.0, ge=0)
    """reward: longest a request waits for others to fill a batch, in ms (Triton: max_queue_delay_microseconds
    / 1000)"""
    max_queue_rows: int = Field(65536, ge=1)
    """reward: sequences waiting for the model, at least max_batch_size; a request that would queue more gets
    503 with Retry-After, and one of more sequences than this gets 413 before its data is decoded"""
    max_request_tokens: int = Field(1 << 20, ge=1)
    """reward: token ids one request may carry (a 'tokens' input's rows x tokens, as declared by its shape);
    more gets 413 naming this key, before the data is decoded. Sentences are bounded by max_body_bytes, each
    cut to its last (max_length + 1) x (the tokenizer's longest token) characters before tokenising"""
    max_queue: int = Field(64, ge=1)
    """chat: requests queued or generating; one more gets 503 with Retry-After"""
    read_timeout_s: float = Field(30.0, gt=0)
    """a connection that sends nothing for this long is closed (idle keep-alive too)"""
    request_deadline_s: float = Field(60.0, gt=0)
    """a request's head and body must arrive within this many seconds of its first byte (cuts slowloris
    clients; a body still arriving gets 408)"""
    max_connections: int | None = Field(None, ge=1)
    """open client connections; past it an idle one is closed, or the newcomer gets 503. Unset: half the
    open-file limit (raised to the hard limit at start), at most 4096"""
    max_body_bytes: int = Field(8 << 20, ge=1024)
    """largest request body in bytes (after decompression); bigger requests get 413, and the RL steps' reward
    client, which cuts at 4 MiB, then sends the rows in smaller requests"""
    max_length: int = Field(128, ge=8)
    """reward: tokens per scored sequence, capped at the model's context; a longer one keeps its last
    max_length tokens"""

    @model_validator(mode="after")
    def _batching_keeps_the_batchers_rules(self) -> Self:
        """preferred_batch_size at most max_batch_size, max_queue_rows at least it: the batcher's own rules,
        refused here before a job is written rather than when the server starts."""
        BatchingConfig(
            self.max_batch_size, self.preferred_batch_size, self.max_queue_delay_ms, self.max_queue_rows
        )
        return self


class Config(Strict):
    """rm/serve: a reward model behind a KServe v2 (Triton-compatible) HTTP server."""

    backend: Literal["builtin", "nemo_aligner"] = "builtin"
    """builtin: our KServe v2 server on a Hugging Face reward model; nemo_aligner: NeMo-Aligner v0.7.0's
    serve_reward_model.py (PyTriton) on a .nemo reward model, on Slurm (docs/nemo-aligner.md)"""
    inputs: Inputs = Field(default_factory=Inputs)
    server: Server = Field(default_factory=Server)
    runtime: ServeRuntime = Field(default_factory=ServeRuntime)
    plan: ResourcePlan = Field(default_factory=ResourcePlan)
    """the resource plan's model hints and what a plan that cannot fit does"""

    def workload(self) -> Workload:
        return Serving("server.max_batch_size", self.server.max_batch_size, self.server.max_length)
