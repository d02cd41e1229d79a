"""What a push uploads (``hub.push``): the run's files (``collect_files``), each with no local path left in it
(``public_files``: ``hf_grpo.publish.public``'s rules), every one scanned for the token before anything is sent, and,
with ``--merged``, the adapter merged into its base (``merge_adapter``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..base.hub_token import TOKEN_SHAPE
from ..base.run_files import EVAL_FILE, EVAL_RECORDS, HISTORY_FILE, PLOT_FILE, RECIPE_FILE, SUMMARY_FILE, VERSIONS_FILE
from .card import CARD_FILE
from .public import public_recipe, public_value, scrub_paths
from .run_result import ADAPTER_FILES, MODEL_SHARD, RunResult, run_kind


logger = logging.getLogger(__name__)


class HubUsageError(ValueError):
    """Something the user can fix before a push: missing files, no token, a token inside a file, a bad repo id; the
    CLI exits with 2 (as for a run file that does not parse, ``RunFileError``)."""


MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
RUN_FILES = (RECIPE_FILE, EVAL_FILE, HISTORY_FILE, PLOT_FILE, SUMMARY_FILE, VERSIONS_FILE)


# ---------------------------------------------------------------------------------------------------------------------
# Files to upload


def collect_files(output_dir: str | Path, *, weights: bool = True) -> tuple[dict[str, Path], list[str]]:
    """(path in repo -> local file, left-out entries) for ``output_dir``; README.md is never taken from disk."""
    out = Path(output_dir)
    kind = run_kind(out)
    names = list(TOKENIZER_FILES) + list(RUN_FILES)
    names += sorted(p.name for p in out.glob(EVAL_RECORDS.format(label="*")))  # per-problem held-out records
    if weights and kind == "adapter":
        names += list(ADAPTER_FILES)
    elif weights and kind == "model":
        names += list(MODEL_FILES) + sorted(p.name for p in out.iterdir() if MODEL_SHARD.match(p.name))
    files = {name: out / name for name in names if (out / name).is_file()}
    left_out = sorted(
        p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in files and p.name != CARD_FILE
    )
    return dict(sorted(files.items())), left_out


# ---------------------------------------------------------------------------------------------------------------------
# Local paths in the uploaded files (the rule and the helpers are hf_grpo.publish.card's)


JSON_FILES = ("adapter_config.json", "config.json", "generation_config.json", EVAL_FILE, HISTORY_FILE, VERSIONS_FILE)
TOP_LEVEL_JSON_FILES = ("tokenizer_config.json",)  # only top-level values: the added tokens are left as they are


def _public_json(name: str, data: bytes) -> bytes | None:
    try:
        values = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not ours to fix; the token scan still reads it
    if name in TOP_LEVEL_JSON_FILES and isinstance(values, dict):
        public = {k: public_value(v, nested=False) for k, v in values.items()}
    else:
        public = public_value(values)
    return None if public == values else (json.dumps(public, indent=2, ensure_ascii=False) + "\n").encode()


def public_copy(name: str, path: Path) -> bytes | None:
    """What to upload instead of the run's file ``name`` when it names local paths; None to upload it as it is.

    Rewritten: ``recipe.yaml`` (``public_recipe``), ``summary.md`` (``scrub_paths``) and the JSON files hf_grpo,
    PEFT and transformers write (a value that is a local path becomes its file name: ``adapter_config.json``'s
    ``base_model_name_or_path`` of the embedded tiny model is ``base_model``). Not touched: weights, the tokenizer's
    vocabulary, the chat template and the per-problem ``eval_*.jsonl`` records (prompts, references and completions
    as the model saw and wrote them).
    """
    if name in JSON_FILES or name in TOP_LEVEL_JSON_FILES:
        return _public_json(name, path.read_bytes())
    clean = {RECIPE_FILE: public_recipe, SUMMARY_FILE: scrub_paths}.get(name)
    if clean is None:
        return None
    text = path.read_text()
    public = clean(text)
    return None if public == text else public.encode()


def public_files(files: dict[str, Path]) -> dict[str, Path | bytes]:
    """``files`` (path in repo -> local file) with the files that name local paths replaced by cleaned bytes."""
    return {name: path if (cleaned := public_copy(name, path)) is None else cleaned for name, path in files.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Secrets


def _scan_bytes(name: str, data: bytes, token: str | None) -> None:
    if token and len(token) >= 8 and token.encode() in data:
        raise HubUsageError(
            f"refusing to push: {name} contains the value of HF_TOKEN; remove it from the file (and revoke the "
            "token if the file was ever shared), then push again"
        )
    if TOKEN_SHAPE.search(data):
        raise HubUsageError(
            f"refusing to push: {name} contains a string shaped like a Hugging Face access token (hf_ followed by "
            "letters and digits); remove it from the file (and revoke it if it is a real token), then push again"
        )


def _safetensors_header(path: Path) -> bytes:
    """The JSON header of a safetensors file (tensor names, shapes and free-form metadata), not the tensor data."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return f.read(min(size, 100_000_000))


def scan_for_tokens(files: dict[str, Path | bytes], token: str | None) -> None:
    """Raise ``HubUsageError`` naming the first file holding the token or a token-shaped string.

    Every file is read in full except weight files (``*.safetensors``), where only the header with its metadata is
    read: the tensor data is numbers, and a 15 GB merged model should not be read twice.
    """
    for name, source in files.items():
        if isinstance(source, bytes):
            data = source
        elif name.endswith(".safetensors"):
            data = _safetensors_header(source)
        else:
            data = source.read_bytes()
        _scan_bytes(name, data, token)


# ---------------------------------------------------------------------------------------------------------------------
# Merge


def _merge_base(run: RunResult) -> str:
    if (run.output_dir / "base_model").is_dir():
        return str(run.output_dir / "base_model")
    base = (run.adapter_config or {}).get("base_model_name_or_path") or run.values.get("model_name_or_path")
    if not base or base == "tiny":
        raise HubUsageError(
            f"--merged needs the base model, but neither {run.output_dir}/base_model nor adapter_config.json's "
            "base_model_name_or_path nor the recipe's model_name_or_path names it"
        )
    return base


def merge_adapter(run: RunResult, save_dir: str | Path) -> Path:
    """Load the base model and the adapter of ``run``, merge them and save the result (safetensors)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _merge_base(run)
    logger.info("merging the adapter into %s", base)
    model = AutoModelForCausalLM.from_pretrained(
        base,
        revision=run.values.get("model_revision") if not Path(base).exists() else None,
        dtype="auto",
        trust_remote_code=bool(run.values.get("trust_remote_code", False)),
    )
    merged = PeftModel.from_pretrained(model, str(run.output_dir)).merge_and_unload()
    save_dir = Path(save_dir)
    merged.save_pretrained(save_dir, safe_serialization=True)
    return save_dir
