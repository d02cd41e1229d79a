"""Push a finished run to the Hugging Face Hub: the LoRA adapter (or merged weights) with a model card.

    export HF_TOKEN=hf_...                                   # a token with write access; never put it in a file
    python -m hf_grpo.hub outputs/tiny me/tiny-grpo           # the adapter, private repo
    python -m hf_grpo.hub outputs/qwen7b me/qwen7b-grpo --merged --public --revision v1

What goes up (one commit): the adapter (``adapter_model.safetensors``, ``adapter_config.json``) or, for a full
fine-tune, the model weights and config; the tokenizer files; the run's ``recipe.yaml``, ``eval_results.json``,
``training_history.json``, ``training_curves.png`` and ``summary.md``; and ``README.md``, a model card written from
those files (what was trained and how, the before/after held-out table with the paired difference, its 95% interval
and the right -> wrong / wrong -> right counts, the plot, the library versions, the full recipe, how to load it).
Nothing else: no ``checkpoint-*/``, ``vllm_adapters/``, ``base_model/`` (the embedded tiny model's locally built
base), optimizer states, ``*.bin`` or other pickles, and not the ``README.md`` that PEFT leaves in the output
directory. With ``--merged`` the adapter is folded into its base model
(``merge_and_unload``) and the merged ``model.safetensors`` goes up instead of the adapter.

The token comes only from the environment (``HF_TOKEN``, or ``HUGGING_FACE_HUB_TOKEN``, the names huggingface_hub
reads), never from an argument, a file or the token that ``hf auth login`` saved. It is handed to
``huggingface_hub.HfApi`` in memory and sent only in the ``Authorization`` header. Before anything is sent, every
file to be uploaded (the card included) is scanned for the token's value and for strings shaped like a Hugging Face
token (``hf_`` followed by 30+ letters and digits); a hit refuses the push with a message naming the file, never the
token. Error messages from the Hub client are redacted the same way.

``HF_ENDPOINT`` is read when ``push`` runs (not when huggingface_hub is imported), so a test can point it at a
local server (``tests/fixtures/fake_hub.py``). The command line exits with 2 on a user error (missing or empty
output directory, no token in the environment, offline mode, a token found in a file, a bad repo id) and 1 when
the Hub refuses the upload.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .outputs import EVAL_FILE, HISTORY_FILE, PLOT_FILE, RECIPE_FILE, SUMMARY_FILE, VERSIONS_FILE


logger = logging.getLogger("hf_grpo.hub")

CARD_FILE = "README.md"

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")
MODEL_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
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
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "hf_grpo")
TAGS = ["trl", "grpo", "hf_grpo", "math"]
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # huggingface_hub's order of precedence
# User access tokens are "hf_" + 34 letters/digits; 30+ leaves room for other lengths without matching identifiers
# such as hf_grpo_something.
TOKEN_SHAPE = re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9_])")
TOKEN_SHAPE_TEXT = re.compile(TOKEN_SHAPE.pattern.decode())
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_COMMIT_MESSAGE = "Upload GRPO-trained model (hf_grpo)"


class HubUsageError(ValueError):
    """Something the user can fix (missing files, no token, a token inside a file); the CLI exits with 2."""


class HubPushError(RuntimeError):
    """The Hub (or the network) refused the push; the message is already redacted. The CLI exits with 1."""


@dataclass
class PushResult:
    repo_id: str
    repo_url: str
    revision: str
    commit_url: str
    private: bool
    merged: bool
    files: list[str] = field(default_factory=list)  # paths in the repo, README.md included
    left_out: list[str] = field(default_factory=list)  # entries of output_dir deliberately not uploaded


# ---------------------------------------------------------------------------------------------------------------------
# Reading a run


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HubUsageError(f"{path} is not valid JSON ({exc}); fix or remove it before pushing") from None


def read_recipe(output_dir: str | Path) -> tuple[str | None, dict]:
    """(text, values) of ``recipe.yaml``; (None, {}) when the run has none."""
    import yaml

    path = Path(output_dir) / RECIPE_FILE
    if not path.is_file():
        return None, {}
    text = path.read_text()
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HubUsageError(f"{path} is not valid YAML ({exc}); fix or remove it before pushing") from None
    return text, values if isinstance(values, dict) else {}


def run_kind(output_dir: str | Path) -> str:
    """``"adapter"``, ``"model"`` (full weights in safetensors) or ``""`` (nothing pushable)."""
    out = Path(output_dir)
    if all((out / name).is_file() for name in ADAPTER_FILES):
        return "adapter"
    has_weights = (out / "model.safetensors").is_file() or any(MODEL_SHARD.match(p.name) for p in out.iterdir())
    if (out / "config.json").is_file() and has_weights:
        return "model"
    return ""


def collect_files(output_dir: str | Path, *, weights: bool = True) -> tuple[dict[str, Path], list[str]]:
    """(path in repo -> local file, left-out entries) for ``output_dir``; README.md is never taken from disk."""
    out = Path(output_dir)
    kind = run_kind(out)
    names = list(TOKENIZER_FILES) + list(RUN_FILES)
    if weights and kind == "adapter":
        names += list(ADAPTER_FILES)
    elif weights and kind == "model":
        names += list(MODEL_FILES) + sorted(p.name for p in out.iterdir() if MODEL_SHARD.match(p.name))
    files = {name: out / name for name in names if (out / name).is_file()}
    left_out = sorted(
        p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in files and p.name != CARD_FILE
    )
    return dict(sorted(files.items())), left_out


def library_versions() -> dict[str, str]:
    """The versions of Python and the libraries a run depends on, in this environment."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _recorded_versions(output_dir: Path) -> tuple[dict[str, str], bool]:
    """(versions, recorded at training time?): ``versions.json`` when the run wrote one, else this environment's."""
    recorded = _read_json(output_dir / VERSIONS_FILE)
    if isinstance(recorded, dict) and recorded:
        return {str(k): str(v) for k, v in recorded.items()}, True
    return library_versions(), False


def _hub_model_id(name: Any) -> str | None:
    """``name`` when it looks like a Hub model id (``owner/name``) and is not a local path, else None."""
    if not isinstance(name, str) or not HUB_REPO_ID.match(name) or name.startswith((".", "~")):
        return None
    return None if Path(name).expanduser().exists() else name


def _hub_dataset_id(name: Any) -> str | None:
    if not isinstance(name, str) or name == "arithmetic":
        return None
    with contextlib.suppress(Exception):  # the alias table lives with the loaders
        from .data.loaders import ALIASES

        name = ALIASES.get(name, name)
    return name if HUB_REPO_ID.match(name) and not Path(name).expanduser().exists() else None


def _defaults() -> dict[str, Any]:
    """Default value of every recipe key (empty when the config classes cannot be imported)."""
    import dataclasses

    try:
        from .recipe import field_index
    except Exception:  # noqa: BLE001 - the card still renders without defaults
        return {}
    defaults = {}
    for name, (_, f, _) in field_index().items():
        if f.default is not dataclasses.MISSING:
            defaults[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[name] = f.default_factory()
    return defaults


# ---------------------------------------------------------------------------------------------------------------------
# Model card


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _setting(values: dict, defaults: dict, key: str) -> str | None:
    if key in values:
        return f"`{_fmt(values[key])}`"
    if key in defaults:
        return f"`{_fmt(defaults[key])}` (default)"
    return None


def _base_description(values: dict, adapter_config: dict | None) -> tuple[str, str, str | None]:
    """(short name, Markdown description, Hub id or None) of the base model."""
    name = values.get("model_name_or_path")
    if name == "tiny":
        size = values.get("tiny_hidden_size", 128)
        warm = values.get("warm_start_steps", 300)
        long = (
            f"the embedded tiny Qwen2-architecture model of hf_grpo (2 layers, hidden size {size}), built from "
            f"scratch on the training machine and warm-started with {warm} supervised steps; not on the Hub"
        )
        return "the embedded tiny model of hf_grpo", long, None
    hub_id = _hub_model_id((adapter_config or {}).get("base_model_name_or_path")) or _hub_model_id(name)
    if hub_id:
        revision = values.get("model_revision")
        suffix = f" (revision `{revision}`)" if revision and revision != "main" else ""
        link = f"[{hub_id}](https://huggingface.co/{hub_id}){suffix}"
        return link, link, hub_id
    local = "a local model" + (f" (`{Path(str(name)).name}`)" if name else "")
    return local, local, None


def _dataset_task(values: dict, defaults: dict) -> tuple[str, str | None, str | None]:
    """(dataset name as given, its Hub id or None, grading task ``gsm8k``/``math`` or None)."""
    name = values.get("dataset_name", defaults.get("dataset_name", "arithmetic"))
    task = values.get("task")
    with contextlib.suppress(Exception):  # the presets live with the loaders
        from .data.loaders import ALIASES, PRESETS

        task = task or PRESETS.get(ALIASES.get(name, name), {}).get("task")
    return name, _hub_dataset_id(name), task


def _data_description(values: dict, defaults: dict) -> str:
    name, hub_id, _ = _dataset_task(values, defaults)
    if name == "arithmetic":
        train = values.get("arithmetic_train_size", defaults.get("arithmetic_train_size"))
        held = values.get("arithmetic_eval_size", defaults.get("arithmetic_eval_size"))
        sizes = f"; {train} problems for training, {held} held out" if train and held else ""
        return (
            "arithmetic word problems generated by hf_grpo (`hf_grpo.data.arithmetic`): GSM8K-style, the answer "
            f"after `####`{sizes}"
        )
    if hub_id:
        config = values.get("dataset_config")
        return f"[{hub_id}](https://huggingface.co/datasets/{hub_id})" + (f" (config `{config}`)" if config else "")
    return f"a local file (`{Path(str(name)).name}`)"


GRADING = {
    "gsm8k": "the number after its `####` equals the gold answer",
    "math": "its last `\\boxed{}` is equivalent to the gold answer (checked with math-verify)",
}


def _history_facts(history: list[dict]) -> str | None:
    if not history:
        return None
    facts = [f"{history[-1].get('step', '?')} optimizer steps"]
    runtime = next((r["train_runtime"] for r in reversed(history) if "train_runtime" in r), None)
    if runtime is not None:
        facts.append(f"{runtime:.0f} s of training")
    logged = [r for r in history if r.get("reward") is not None]
    if logged:
        facts.append(
            f"mean reward {logged[0]['reward']:.3f} at the first log and {logged[-1]['reward']:.3f} at the last"
        )
    return "This run: " + ", ".join(facts) + "."


def _front_matter(meta: dict) -> str:
    import yaml

    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def model_card(output_dir: str | Path, repo_id: str, *, merged: bool = False) -> str:
    """The README.md for ``repo_id``: Hub metadata, how the model was trained, results, versions, the recipe."""
    out = Path(output_dir)
    kind = "model" if merged else run_kind(out) or "adapter"
    recipe_text, values = read_recipe(out)
    defaults = _defaults()
    adapter_config = _read_json(out / "adapter_config.json")
    results = _read_json(out / EVAL_FILE)
    history = _read_json(out / HISTORY_FILE) or []
    has_eval = isinstance(results, dict) and "before" in results and "after" in results
    gain = None
    if has_eval:
        from .evaluation.report import read_gain

        gain = read_gain(out, results)
    versions, recorded = _recorded_versions(out)
    base_short, base_text, base_id = _base_description(values, adapter_config)
    _, dataset_id, task = _dataset_task(values, defaults)

    meta: dict[str, Any] = {"library_name": "peft" if kind == "adapter" else "transformers"}
    if base_id:
        meta["base_model"] = base_id
        if merged:
            meta["base_model_relation"] = "merge"
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = list(TAGS)
    if dataset_id:
        meta["datasets"] = [dataset_id]

    title = repo_id.split("/")[-1]
    if merged:
        what = f"This is {base_short} with a LoRA adapter merged into its weights."
    elif kind == "adapter":
        what = f"This is a LoRA adapter for {base_short}."
    else:
        what = f"This is {base_short}, fine-tuned in full."
    lines = [_front_matter(meta), f"# {title}", ""]
    lines.append(
        f"{what} It was trained with GRPO (Group Relative Policy Optimization: several "
        "completions are sampled per problem and each one is pushed up or down by how its reward compares with the "
        "rest of its group) to solve math word problems, with hf_grpo, a recipe-driven trainer built on "
        "[TRL](https://github.com/huggingface/trl)'s `GRPOTrainer`."
    )
    if has_eval:
        from .evaluation.report import gain_interval

        paired = f", a paired difference of {gain_interval(gain)}" if gain is not None else ""
        lines.append("")
        lines.append(
            f"On {results['after']['total']} held-out problems, greedy-decoded, accuracy went from "
            f"{results['before']['accuracy']:.1%} before training to {results['after']['accuracy']:.1%} after{paired}."
        )
    lines.append("")

    # Training
    lines += ["## Training", ""]
    lines.append(f"- **Base model**: {base_text}")
    lines.append(f"- **Data**: {_data_description(values, defaults)}")
    rewards = values.get("reward_funcs", defaults.get("reward_funcs")) or []
    reward_text = ", ".join(f"`{r}`" for r in rewards) or "none recorded"
    weights = values.get("reward_weights")
    if weights:
        reward_text += f" with weights {_fmt(weights)}"
    lines.append(f"- **Rewards**: {reward_text}")
    if kind == "adapter" or merged:
        cfg = adapter_config or {}
        targets = cfg.get("target_modules") or values.get("lora_target_modules")
        lines.append(
            f"- **LoRA**: rank {cfg.get('r', values.get('lora_r'))}, alpha {cfg.get('lora_alpha', values.get('lora_alpha'))}, "
            f"dropout {_fmt(cfg.get('lora_dropout', values.get('lora_dropout')))}, on "
            f"{_fmt(sorted(targets) if isinstance(targets, list) else targets)}"
        )
    settings = [
        ("learning rate", "learning_rate"),
        ("schedule", "lr_scheduler_type"),
        ("optimizer steps (max_steps)", "max_steps"),
        ("completions per prompt (num_generations)", "num_generations"),
        ("per-device batch (completions)", "per_device_train_batch_size"),
        ("gradient accumulation", "gradient_accumulation_steps"),
        ("max completion length", "max_completion_length"),
        ("sampling temperature", "temperature"),
        ("KL coefficient (beta)", "beta"),
        ("loss", "loss_type"),
        ("reward scaling", "scale_rewards"),
        ("clipping epsilon", "epsilon"),
        ("dynamic sampling", "dynamic_sampling"),
        ("advantage estimator", "advantage_estimator"),
        ("seed", "seed"),
    ]
    rows = [(label, _setting(values, defaults, key)) for label, key in settings]
    rows = [(label, text) for label, text in rows if text is not None]
    if rows:
        lines += ["", "Key GRPO settings (the full recipe is below):", "", "| setting | value |", "|---|---|"]
        lines += [f"| {label} | {text} |" for label, text in rows]
    facts = _history_facts(history)
    if facts:
        lines += ["", facts]
    lines.append("")

    # Results
    lines += ["## Held-out accuracy", ""]
    if has_eval:
        from .evaluation.report import eval_table, gain_sentence

        grading = f" A completion counts as correct when {GRADING[task]}." if task in GRADING else ""
        lines += [
            (
                f"Greedy decoding on {results['after']['total']} held-out problems (the run's evaluation split)."
                f"{grading} *Before* is the starting policy, *after* is this model."
            ),
            "",
            eval_table(results, gain),
            "",
        ]
        if gain is not None:
            lines += [gain_sentence(gain), ""]
    else:
        lines += ["This run recorded no before/after evaluation (`eval_results.json` is missing).", ""]

    if (out / PLOT_FILE).is_file():
        lines += [
            "## Training curves",
            "",
            (
                "Mean reward per step, train vs held-out accuracy"
                + (" (with the before -> after difference and its 95% interval)" if gain is not None else "")
                + ", policy loss, and the per-step reward range:"
            ),
            "",
            f"![training curves]({PLOT_FILE})",
            "",
        ]

    # Usage
    lines += ["## Usage", ""]
    if kind == "adapter":
        base_ref = base_id or "PATH/TO/BASE_MODEL"
        if base_id is None:
            lines += [
                (
                    "The base model is not on the Hub, so point `from_pretrained` at a local copy of it (for the embedded "
                    "tiny model: the `base_model/` folder of the training run). Or push with `--merged` to get a "
                    "standalone model."
                ),
                "",
            ]
        lines += [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{base_ref}")',
            f'model = PeftModel.from_pretrained(base, "{repo_id}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "model = model.merge_and_unload()  # optional: fold the adapter into the weights for faster inference",
            "```",
        ]
    else:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "```",
        ]
    lines += [
        "",
        (
            "Prompts go through the tokenizer's chat template as in training, e.g. "
            '`tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)`.'
        ),
        "",
    ]

    # Versions
    where = "recorded when the model was trained" if recorded else "of the environment that pushed this model"
    lines += [f"## Framework versions ({where})", "", "| library | version |", "|---|---|"]
    lines += [f"| {name} | {version} |" for name, version in versions.items()]
    lines.append("")

    # Recipe
    lines += ["## Recipe", ""]
    if recipe_text is not None:
        lines += [
            (
                f"The resolved recipe of this run (`{RECIPE_FILE}`, also in this repository). Train again with "
                f"`python -m hf_grpo.train {RECIPE_FILE} --output_dir DIR` (any other key can be overridden the "
                "same way)."
            ),
            "",
            "```yaml",
            recipe_text.rstrip("\n"),
            "```",
            "",
        ]
    else:
        lines += ["This run left no `recipe.yaml`.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Secrets


def env_token() -> str | None:
    """The Hub token from the environment, as huggingface_hub reads it (``HF_TOKEN``, then the old name)."""
    for name in TOKEN_ENV:
        value = (os.environ.get(name) or "").strip()
        if value:
            return value
    return None


def redact(text: str, token: str | None) -> str:
    """``text`` with the token and anything token-shaped replaced."""
    if token:
        text = text.replace(token, "<redacted>")
    return TOKEN_SHAPE_TEXT.sub("hf_<redacted>", text)


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors")


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
        elif _is_weights(name):
            data = _safetensors_header(source)
        else:
            data = source.read_bytes()
        _scan_bytes(name, data, token)


# ---------------------------------------------------------------------------------------------------------------------
# Merge


def _merge_base(output_dir: Path, values: dict) -> str:
    if (output_dir / "base_model").is_dir():
        return str(output_dir / "base_model")
    adapter_config = _read_json(output_dir / "adapter_config.json") or {}
    base = adapter_config.get("base_model_name_or_path") or values.get("model_name_or_path")
    if not base or base == "tiny":
        raise HubUsageError(
            f"--merged needs the base model, but neither {output_dir}/base_model nor adapter_config.json's "
            "base_model_name_or_path nor the recipe's model_name_or_path names it"
        )
    return base


def merge_adapter(output_dir: str | Path, save_dir: str | Path) -> Path:
    """Load the base model and the adapter of ``output_dir``, merge them and save the result (safetensors)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = Path(output_dir)
    _, values = read_recipe(out)
    base = _merge_base(out, values)
    logger.info("merging the adapter into %s", base)
    model = AutoModelForCausalLM.from_pretrained(
        base,
        revision=values.get("model_revision") if not Path(base).exists() else None,
        dtype="auto",
        trust_remote_code=bool(values.get("trust_remote_code", False)),
    )
    merged = PeftModel.from_pretrained(model, str(out)).merge_and_unload()
    save_dir = Path(save_dir)
    merged.save_pretrained(save_dir, safe_serialization=True)
    return save_dir


# ---------------------------------------------------------------------------------------------------------------------
# Push


def _check_output_dir(output_dir: Path, merged: bool) -> str:
    if not output_dir.is_dir():
        raise HubUsageError(f"output directory {str(output_dir)!r} does not exist; pass the output_dir of a run")
    kind = run_kind(output_dir)
    if not kind:
        raise HubUsageError(
            f"{output_dir} holds no adapter (adapter_config.json + adapter_model.safetensors) and no model "
            "(config.json + model*.safetensors); is it the output_dir of a finished run?"
        )
    if merged and kind != "adapter":
        raise HubUsageError(f"--merged needs a LoRA adapter, but {output_dir} holds full model weights; drop --merged")
    return kind


def push(
    output_dir: str | Path,
    repo_id: str,
    *,
    private: bool = True,
    merged: bool = False,
    revision: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
) -> PushResult:
    """Create ``repo_id`` (if needed) and upload the run in ``output_dir`` to it in one commit.

    The token is read from the environment (``HF_TOKEN``) and the endpoint from ``HF_ENDPOINT``, both at call time.
    Raises ``HubUsageError`` for what the user can fix (before anything is sent) and ``HubPushError`` when the Hub
    refuses; neither message contains the token.
    """
    from huggingface_hub import CommitOperationAdd, HfApi, constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    out = Path(output_dir)
    _check_output_dir(out, merged)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubUsageError(f"invalid repo id {repo_id!r}: {exc}") from None
    token = env_token()
    if token is None:
        raise HubUsageError(
            "no Hugging Face token in the environment: export HF_TOKEN=hf_... (a token with write access, from "
            "https://huggingface.co/settings/tokens); hf_grpo never reads tokens from files or arguments"
        )
    if constants.is_offline_mode():
        raise HubUsageError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set; unset it to push to the Hub")
    revision = revision or None
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")

    with tempfile.TemporaryDirectory(prefix="hf_grpo_merged_") as tmp:
        files, left_out = collect_files(out, weights=not merged)
        scan_for_tokens(files, token)  # before anything is sent; the files first, since the card quotes some
        uploads: dict[str, Path | bytes] = {CARD_FILE: model_card(out, repo_id, merged=merged).encode()}
        scan_for_tokens(uploads, token)
        if merged:  # after the cheap checks: merging a large model takes a while
            merged_dir = merge_adapter(out, tmp)
            weights = {p.name: p for p in merged_dir.iterdir() if p.name in MODEL_FILES or MODEL_SHARD.match(p.name)}
            scan_for_tokens(weights, token)
            files.update(weights)
        uploads.update(sorted(files.items()))

        api = HfApi(
            endpoint=endpoint, token=token, library_name="hf_grpo", library_version=library_versions()["hf_grpo"]
        )
        with _hub_errors(repo_id, token):
            repo_url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        full_id = repo_url.repo_id or repo_id
        if full_id != repo_id:  # "name" alone lands in the token owner's namespace: the card shows the real id
            uploads[CARD_FILE] = model_card(out, full_id, merged=merged).encode()
            scan_for_tokens({CARD_FILE: uploads[CARD_FILE]}, token)
        with _hub_errors(full_id, token):
            if revision and revision != "main":
                api.create_branch(full_id, branch=revision, repo_type="model", exist_ok=True)
            operations = [
                CommitOperationAdd(name, source if isinstance(source, bytes) else str(source))
                for name, source in uploads.items()
            ]
            logger.info("uploading %d files to %s", len(operations), full_id)
            info = api.create_commit(
                full_id, operations, commit_message=commit_message, repo_type="model", revision=revision
            )
    return PushResult(
        repo_id=full_id,
        repo_url=str(repo_url),
        revision=revision or "main",
        commit_url=str(info.commit_url),
        private=private,
        merged=merged,
        files=list(uploads),
        left_out=left_out,
    )


@contextlib.contextmanager
def _hub_errors(repo_id: str, token: str):
    """Turn any failure of the Hub client into ``HubPushError`` with the token scrubbed from the message."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised, redacted, without the original traceback
        raise HubPushError(redact(f"push to {repo_id} failed: {type(exc).__name__}: {exc}", token)) from None


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hf_grpo.hub",
        description="Push a finished hf_grpo run (adapter or merged model, with a model card) to the Hugging Face "
        "Hub. The token is read from the HF_TOKEN environment variable only.",
    )
    parser.add_argument("output_dir", help="the output_dir of a finished run")
    parser.add_argument("repo_id", help="Hub repository, e.g. me/qwen7b-grpo (created if missing)")
    parser.add_argument("--merged", action="store_true", help="merge the LoRA adapter into its base and push that")
    parser.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    parser.add_argument("--revision", default=None, help="branch to commit to (created if missing; default main)")
    parser.add_argument("-m", "--message", default=DEFAULT_COMMIT_MESSAGE, help="commit message")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        result = push(
            args.output_dir,
            args.repo_id,
            private=not args.public,
            merged=args.merged,
            revision=args.revision,
            commit_message=args.message,
        )
    except HubUsageError as exc:
        print(f"hf_grpo.hub: error: {redact(str(exc), env_token())}", file=sys.stderr)  # noqa: T201
        return 2
    except HubPushError as exc:
        print(f"hf_grpo.hub: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    visibility = "private" if result.private else "public"
    what = "merged model" if result.merged else "run"
    print(f"pushed the {what} to {result.repo_url} (revision {result.revision}; {visibility} if newly created)")  # noqa: T201
    print(f"uploaded {len(result.files)} files:")  # noqa: T201
    for name in result.files:
        print(f"  {name}")  # noqa: T201
    if result.left_out:
        print(f"left out: {', '.join(result.left_out)}")  # noqa: T201
    print(f"commit: {result.commit_url}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
