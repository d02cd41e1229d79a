"""The file checks of ``python -m hf_grpo.evaluate``, cheap enough to run before a model or a dataset is loaded.

A model or adapter directory whose files are whole (``check_weights``: each safetensors file's header parses and
its tensors fill the file, each shard an index lists is there), a hub id that can be downloaded or is cached, an
``--output`` path in a writable directory. Each check raises ``ValueError`` (or ``FileNotFoundError``) with a message
that names the problem and the fix. The recipe checks (``hf_grpo.recipe``) use the model checks too.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ..base.run_files import EVAL_RECORDS, is_run_folder
from ..models import registry as local_models


WEIGHTS_FIX = "a save, copy or download was cut short: save, copy or download it again"
# what from_pretrained needs of a hub model besides config.json (any one of them): its weights, or their shard index
HUB_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


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


def check_hub_id(name: str, offline: bool | None = None, revision: str | None = None) -> None:
    """``name``, which is no local path, can be a hub model: a valid repo id, and (``offline``: HF_HUB_OFFLINE by
    default) its config and weights in the hub cache, which ``check_weights`` checks; with a hub, nothing is asked of
    it here (``from_pretrained`` downloads, or says why not)."""
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
    if name in local_models.PACKAGED_MODELS:  # no hub id: `hf-grpo model get` makes its folder
        raise FileNotFoundError(unknown_model_message(name))
    if not (constants.HF_HUB_OFFLINE if offline is None else offline):
        return
    cached = {file: try_to_load_from_cache(name, file, revision=revision) for file in ("config.json", *HUB_WEIGHTS)}
    cached = {file: path for file, path in cached.items() if isinstance(path, str)}
    if "config.json" in cached and len(cached) > 1:
        check_weights(Path(cached["config.json"]).parent, f"download it again: `hf download {name} --force-download`")
        return
    raise FileNotFoundError(unknown_model_message(name))


def unknown_model_message(name: str) -> str:
    """``name`` is no folder, no packaged model and not in the hub cache (offline): the names that would work."""
    if name in local_models.PACKAGED_MODELS:
        first = "" if local_models.is_ready(name) else f" once `{local_models.GET_COMMAND} {name}` has made it"
        return f"{name} is a model `{local_models.GET_COMMAND}` makes: pass its folder {local_models.resolve(name)}{first}"
    known = sorted(local_models.PACKAGED_MODELS)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]} (get it with `{local_models.GET_COMMAND} {close[0]}`)? " if close else ""
    return (
        f"{name} is no folder, no model `{local_models.GET_COMMAND}` makes ({', '.join(known)}), and not in the hub "
        f"cache, and HF_HUB_OFFLINE is set, so it cannot be downloaded; {hint}pass a model folder, a name of "
        "`hf-grpo model list`, or unset HF_HUB_OFFLINE to download a hub model"
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


def check_weights(path: Path, fix: str | None = None) -> None:
    """Every weights file in ``path`` is whole, read from headers only: each shard a ``*.index.json`` lists is there,
    and each ``*.safetensors`` file (``safetensors_problem``). ``ValueError`` names the file and ``fix`` (by default:
    ``hf-grpo model get NAME --force`` for a folder it made, else make the file again)."""
    fix = fix or local_models.refetch_fix(path) or WEIGHTS_FIX
    for index in sorted([*path.glob("*.safetensors.index.json"), *path.glob("*.bin.index.json")]):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{index} is not a shard index ({exc!r}); {fix}") from None
        missing = sorted(str(shard) for shard in shards if not (path / str(shard)).is_file())
        if missing:
            raise ValueError(f"{path} lacks {', '.join(missing)}, which {index.name} lists; {fix}")
    for file in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise ValueError(f"{file} {problem}; {fix}")


def safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file, or None: its length against what its header says (8 bytes of header
    length, the JSON header, the tensor data), then the header as safetensors itself validates it when it loads
    (dtypes, shapes, offsets; the file is mapped, not read)."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        if size < 8 or 8 + header_length > size:
            return "is empty" if size == 0 else f"is truncated or its header is corrupt ({size} bytes)"
        try:
            header = json.loads(f.read(header_length))
            data = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            data = None  # safetensors says what is wrong with it, below
    if isinstance(data, int) and size < 8 + header_length + data:
        return f"is truncated ({size} bytes, its header says {8 + header_length + data})"
    try:
        with safe_open(str(file), framework="numpy"):
            pass
    except SafetensorError as exc:
        return f"has a corrupt header ({str(exc).removeprefix('Error while deserializing header: ')})"
    return None


RECORD_KEYS = ("index", "grade", "completion")  # what every per-problem record holds (hf_grpo.evaluation.core)


def check_output(output: str | None) -> None:
    """``--output`` names a file in an existing, writable directory (checked before evaluating, not after); an
    existing file is replaced only when it is empty or holds per-problem records (an earlier ``--output``, a run's
    ``eval_*.jsonl``): any other file is the user's."""
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
    if re.fullmatch(EVAL_RECORDS.format(label=".+"), path.name) and is_run_folder(folder):
        raise ValueError(
            f"--output {output} is a record file of the run in {folder} (its report and paired gain read it), so it "
            "is not replaced; pass a path outside the run's folder, or another name"
        )
    if path.is_file() and path.stat().st_size > 0 and not _holds_records(path):
        raise ValueError(
            f"--output {output} exists and holds no per-problem records of an evaluation, so it is not replaced; "
            "pass a new path, or move the file away"
        )


def _holds_records(path: Path) -> bool:
    """Whether the first line of ``path`` is a per-problem record (a JSON object with ``RECORD_KEYS``)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline(1_000_000)
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and all(key in record for key in RECORD_KEYS)


def check_max_new_tokens(model: str, max_new_tokens: int, trust_remote_code: bool = False) -> None:
    """``--max-new-tokens`` leaves room for a prompt in the context of ``model`` (its base model's, for an adapter):
    training's check of ``max_completion_length`` (``hf_grpo.data.lengths.prompt_budget``). Skipped when the config
    cannot be read (the model's loading says why)."""
    from transformers import AutoConfig  # transformers, torch: only for --max-new-tokens, after the cheap checks

    from ..data.lengths import context_limits, prompt_budget  # the same (it imports torch)

    path = Path(model).expanduser()
    name = adapter_base(path) if (path / "adapter_config.json").is_file() else model
    try:
        limits = context_limits(AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code))
    except (OSError, ValueError):
        return
    if limits is not None:
        source = f"max_position_embeddings {limits[0]} in the config of {name}"
        prompt_budget(limits[0], max_new_tokens, key="--max-new-tokens", source=source)
