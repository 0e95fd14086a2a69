"""What a NeMo checkpoint (.nemo) holds, read without NeMo or torch: the model config inside its tar, which the
preflight reads to check that the file loads and, for an engine that takes its parallel sizes from it, to divide
them."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from nemotron.models.layout import CheckpointError

NEMO_MODEL_CONFIG = "model_config.yaml"  # inside a .nemo tar (NeMo's NLPSaveRestoreConnector)


def nemo_model_config(path: Path) -> dict[str, Any] | None:
    """The model config of a .nemo file (a tar, its members read one header at a time until model_config.yaml);
    None when `path` is not a local file. A file that is not such a tar raises CheckpointError. Read once per
    process while the file is unchanged: a compile asks for it from the load check, each GPU group of the
    preflight and each trainer's batch rule. Callers must not change the mapping."""
    if not path.is_file():
        return None
    stat = path.stat()
    return _read_model_config(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_model_config(path: Path, _mtime_ns: int, _size: int) -> dict[str, Any]:
    import tarfile  # here: only a .nemo input is read, and a dry run's start-up counts

    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if Path(member.name).name == NEMO_MODEL_CONFIG and member.isfile():
                    handle = tar.extractfile(member)
                    data = yaml.safe_load(handle.read()) if handle is not None else None
                    if not isinstance(data, dict):
                        raise CheckpointError(f"{path}: {NEMO_MODEL_CONFIG} is not a mapping")
                    return data
    except (OSError, tarfile.TarError, yaml.YAMLError, EOFError) as err:
        raise CheckpointError(
            f"{path}: not a readable .nemo (a tar holding {NEMO_MODEL_CONFIG}): {err}"
        ) from err
    raise CheckpointError(f"{path}: not a .nemo checkpoint (no {NEMO_MODEL_CONFIG} inside)")
