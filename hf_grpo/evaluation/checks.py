"""The file checks of ``python -m hf_grpo.evaluate``, cheap enough to run before a model or a dataset is loaded.

A model or adapter directory whose files are whole (safetensors as long as their header says), a hub id that can be
downloaded or is cached, an ``--output`` path in a writable directory. Each check raises ``ValueError`` (or
``FileNotFoundError``) with a message that names the problem and the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def check_model(name: str) -> None:
    """``name`` is a model or adapter directory whose files are whole, or a hub id."""
    path = Path(name).expanduser()
    if not path.exists():
        check_hub_id(name)
        return
    if not path.is_dir():
        raise ValueError(f"{name} is not a directory; pass the directory that holds the model or adapter")
    if (path / "adapter_config.json").is_file():
        check_adapter(path)
    elif (path / "config.json").is_file():
        check_weights(path)
    else:
        raise ValueError(
            f"{name} holds neither config.json nor adapter_config.json; pass a run's output_dir, a saved model or "
            "a LoRA adapter directory"
        )


def check_hub_id(name: str) -> None:
    """``name``, which is no local path, can be a hub model: a valid repo id, and in the hub cache when offline."""
    # imported here: huggingface_hub takes a moment to import, and only a name that is no local path needs it
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
        valid = not name.startswith(("./", "../", "~"))
    except HFValidationError:
        valid = False
    if not valid:
        raise FileNotFoundError(f"{name} does not exist; pass a run's output_dir, a model directory or a hub id")
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise FileNotFoundError(
            f"{name} does not exist, and is no model in the hub cache (HF_HUB_OFFLINE is set); pass an existing "
            "directory, or unset HF_HUB_OFFLINE to download it"
        )


def adapter_base(path: Path) -> str:
    """The base model of the LoRA adapter in ``path``: its ``base_model/`` when present, else the one it names."""
    if (path / "base_model").is_dir():
        return str(path / "base_model")
    base = read_adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{path / 'adapter_config.json'} names no base model; put the base model in {path / 'base_model'}"
        )
    return base


def read_adapter_config(path: Path) -> dict:
    config = path / "adapter_config.json"
    try:
        values = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{config} is not valid JSON ({exc}); the adapter was not saved completely: save it again or retrain"
        ) from None
    if isinstance(values, dict):
        return values
    raise ValueError(f"{config} is not a JSON object; save the adapter again or retrain")


def check_adapter(path: Path) -> None:
    read_adapter_config(path)
    if not any((path / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")):
        raise ValueError(f"{path} has adapter_config.json but no adapter_model.safetensors; save the adapter again")
    check_weights(path)
    base = adapter_base(path)
    if Path(base).is_dir():
        check_model(base)


def check_weights(path: Path) -> None:
    """Every ``*.safetensors`` file in ``path`` is as long as its header says (not empty, not cut short)."""
    for file in sorted(path.glob("*.safetensors")):
        expected = safetensors_size(file)
        actual = file.stat().st_size
        if expected != actual:
            raise ValueError(
                f"{file} is empty or truncated ({actual} bytes"
                + (f", its header says {expected})" if expected else ")")
                + "; the save was interrupted: save it again or retrain"
            )


def safetensors_size(file: Path) -> int | None:
    """The size a safetensors file must have: 8 bytes of header length, the JSON header, the tensor data; None when
    the header cannot be read."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        if size < 8 or 8 + header_length > size:
            return None
        try:
            header = json.loads(f.read(header_length))
            data = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
    return 8 + header_length + data


def check_output(output: str | None) -> None:
    """``--output`` names a file in an existing, writable directory (checked before evaluating, not after)."""
    if output is None:
        return
    path = Path(output)
    if path.is_dir():
        raise ValueError(f"--output {output} is a directory; pass a file path, e.g. {path / 'records.jsonl'}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--output {output}: directory {folder} does not exist; create it or pass another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: directory {folder} is not writable; pass another path")
