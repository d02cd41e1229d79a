"""Each key and value on its own: unknown keys refused all at once with their fix (``check_known_keys``), and each
value type-checked and coerced against its field's type hint, choices and numeric domain (``check_value``)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import functools
import math
import re
import reprlib
import types
import typing
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .schema import NESTED, RecipeError, nested_index


# String fields of TRL whose accepted values TRL only checks once the trainer is built.
KNOWN_CHOICES = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none", True, False),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_mode": ("server", "colocate"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}
# Secrets never belong in a recipe file: they would be copied into checkpoints, logs and Hub model cards.
SECRET_KEYS = {"hub_token"}

# Numeric domains: key -> (low, low included, high, high included); None is unbounded. A key set to None is unset.
AT_LEAST_1 = (1, True, None, False)
POSITIVE = (0, False, None, False)
NON_NEGATIVE = (0, True, None, False)
DOMAINS = {
    **dict.fromkeys(
        (
            "max_completion_length", "lora_r", "arithmetic_train_size", "arithmetic_eval_size", "num_processes",
            "num_machines", "max_generation_batches", "num_iterations", "max_train_samples", "max_eval_samples",
            "task_eval_max_samples", "eval_max_new_tokens", "keep_top_k", "tiny_hidden_size", "warm_start_batch_size",
            "warm_start_max_lines",
            "per_device_eval_batch_size", "num_generations_eval", "generation_batch_size", "steps_per_generation",
            "reward_workers", "vllm_tensor_parallel_size", "save_total_limit",
        ),
        AT_LEAST_1,
    ),
    **dict.fromkeys(
        (
            "temperature", "lora_alpha", "reward_timeout", "repetition_penalty", "warm_start_lr", "save_steps",
            "gpu_memory_gb",
        ),
        POSITIVE,
    ),
    **dict.fromkeys(
        (
            "learning_rate", "beta", "weight_decay", "max_grad_norm", "warmup_steps", "warm_start_steps",
            "task_eval_steps", "epsilon", "epsilon_high", "seed", "data_seed", "dataloader_num_workers", "top_k",
            "num_train_epochs", "reward_max_failed_calls", "logging_steps", "eval_steps", "adam_epsilon",
        ),
        NON_NEGATIVE,
    ),
    "lora_dropout": (0, True, 1, False),
    "eval_split_size": (0, True, 1, False),
    "arithmetic_two_step_share": (0, True, 1, True),
    "prompt_template_share": (0, True, 1, True),
    "word_problems_max_steps": (1, True, 3, True),
    "top_p": (0, False, 1, True),
    "min_p": (0, True, 1, True),
    "vllm_gpu_memory_utilization": (0, False, 1, True),
    "adam_beta1": (0, True, 1, False),
    "adam_beta2": (0, True, 1, False),
}  # fmt: skip


# What an error message echoes of a value: a few items of each list or mapping, a few levels deep, never the whole of
# a huge value (an alias bomb's repr is hundreds of megabytes).
SHOWN_CHARS = 200
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 80


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, shortened to about ``SHOWN_CHARS`` characters."""
    if isinstance(value, str):
        if len(value) <= SHOWN_CHARS:
            return repr(value)
        return f"{value[: SHOWN_CHARS - 20]!r}... ({len(value)} characters)"
    text = _REPR.repr(value)
    if len(text) > SHOWN_CHARS:
        text = text[:SHOWN_CHARS] + "..."
    if isinstance(value, (list, tuple, dict, set)) and "..." in text:
        text += f" ({len(value)} items)"
    return text


def clipped(message: Any, limit: int = 4 * SHOWN_CHARS) -> str:
    """Another library's error text, shortened as ``shown`` shortens a value (it may quote a huge value whole)."""
    text = str(message)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _inside(value: float, domain: tuple) -> bool:
    low, low_in, high, high_in = domain
    above = value >= low if low_in else value > low
    return above and (high is None or (value <= high if high_in else value < high))


def _describe_domain(domain: tuple) -> str:
    low, low_in, high, high_in = domain
    if high is None:
        return f"{'>=' if low_in else '>'} {low}"
    return f"in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_domain(key: str, value: Any, default: Any) -> None:
    """Refuse a number outside the key's domain (NaN and infinities included), before anything is built."""
    numbers = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
    for number in numbers:
        if isinstance(number, float) and not math.isfinite(number):
            raise RecipeError(f"{key} must be a finite number, got {shown(number)}; write a number such as 1.0")
    domain = DOMAINS.get(key)
    if domain is None or not _is_number(value) or _inside(value, domain):
        return
    rule = _describe_domain(domain)
    if _is_number(default) and _inside(default, domain):
        fix = f"set {key}: {default!r} (its default) or another value {rule}"
    else:
        fix = f"set a value {rule}, or remove {key}"
    raise RecipeError(f"{key} must be {rule}, got {shown(value)}; {fix}")


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """(matches, coerced value) of ``value`` against a type hint."""
    if hint is Any:
        return True, value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            ok, coerced = coerce(value, arg)
            if ok:
                return True, coerced
        return False, value
    if origin is typing.Literal:
        return value in typing.get_args(hint), value
    if hint in (type(None), bool, str):
        return isinstance(value, hint), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if _is_number(value):
            return True, value
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):  # a quoted number such as "1e-6"
            return True, float(value)
        return False, value
    if origin in (list, tuple) or hint in (list, tuple):
        (item_hint,) = typing.get_args(hint) or (Any,)
        items = value if isinstance(value, list) else [value] if isinstance(value, str) else None
        if items is None:
            return False, value
        checked = [coerce(item, item_hint) for item in items]
        ok = all(item_ok for item_ok, _ in checked)
        return (True, [c for _, c in checked]) if ok else (False, value)
    if origin is dict or hint is dict:  # each key and value against the hint's (a floor given as a word is refused)
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        if not isinstance(value, dict):
            return False, value
        checked = {coerce(k, key_hint)[1]: coerce(v, value_hint) for k, v in value.items()}
        ok = all(coerce(k, key_hint)[0] for k in value) and all(item_ok for item_ok, _ in checked.values())
        return (True, {k: c for k, (_, c) in checked.items()}) if ok else (False, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value in {m.value for m in hint}, value
    return False, value


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)


def _non_finite_text(text: str) -> bool:
    """``nan``, ``inf``, ``-Infinity``...: what Python reads as a non-finite float (YAML 1.2 only as ``.nan``)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def check_value(key: str, value: Any, hint: Any, f: dataclasses.Field) -> Any:
    """Type-check and coerce one value; RecipeError names the key, the value and the expected type."""
    if key in SECRET_KEYS and value is not None:
        raise RecipeError(f"{key} must not be set in a recipe; export HF_TOKEN in the environment instead")
    ok, coerced = coerce(value, hint)
    if not ok and isinstance(value, str) and coerce(1.0, hint)[0] and _non_finite_text(value):
        raise RecipeError(f"{key} must be a finite number, got {shown(value)}; set a finite {key}")
    if not ok:
        hint_text = ""
        if isinstance(value, bool) and coerce("x", hint)[0]:
            hint_text = (
                f" (YAML reads an unquoted yes/no/true/false as a boolean; write {key}: '{str(value).lower()}')"
            )
        if isinstance(value, dict):  # which entry is wrong, and what it should be
            args = [a for a in typing.get_args(hint) if typing.get_origin(a) is dict]
            value_hint = typing.get_args(args[0])[1] if args and typing.get_args(args[0]) else Any
            bad = [k for k, v in value.items() if not coerce(v, value_hint)[0]]
            hint_text = f": {key}.{bad[0]} is {shown(value[bad[0]])}, write a {_type_name(value_hint)}" if bad else ""
        raise RecipeError(f"{key} must be {_type_name(hint)}, got {shown(value)} ({type(value).__name__}){hint_text}")
    enums = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, enum.Enum)]
    choices = f.metadata.get("choices") or KNOWN_CHOICES.get(key)
    if enums and isinstance(coerced, str):  # `IntervalStrategy | str` accepts any string, TrainingArguments does not
        choices = [m.value for m in enums[0]]
    if choices is not None and coerced is not None and coerced not in choices:
        raise RecipeError(f"{key} must be one of {list(choices)}, got {shown(coerced)}")
    _check_domain(key, coerced, f.default)
    if key == "hub_model_id" and isinstance(coerced, str):
        _check_hub_id(key, coerced)
    return coerced


# The Hub's repository ids (huggingface_hub.utils.validate_repo_id): `name` or `namespace/name`.
HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]{1,96}$", re.ASCII)


def _check_hub_id(key: str, value: str) -> None:
    """A Hub repository id, checked now rather than at the push after training."""
    bad = not HUB_ID.match(value) or "--" in value or ".." in value or value.endswith(".git")
    if bad or any(part.startswith(("-", ".")) or part.endswith(("-", ".")) for part in value.split("/")):
        raise RecipeError(
            f"{key} {shown(value)} is not a Hub repository id; write name or namespace/name with letters, "
            "digits, '-', '_' and '.' (e.g. your-name/qwen7b-grpo)"
        )


def check_nested(section: str, key: str, value: Any) -> Any:
    """``check_value`` for ``section.key`` of a nested section (``generation.backend``)."""
    known = nested_index(section)
    if not isinstance(key, str):
        raise RecipeError(f"key {shown(key)} in {section} is not a name; see `python -m hf_grpo.train --help`")
    if key not in known:
        raise RecipeError(f"unknown key {section}.{key}{did_you_mean(key, known)}")
    f, hint = known[key]
    return check_value(f"{section}.{key}", value, hint, f)


# Keys of TRL, transformers or open-r1 recipes that were renamed or removed: the exact replacement comes first.
RENAMED = {
    "torch_dtype": "renamed dtype (transformers 5, TRL's ModelConfig): use dtype",
    "warmup_ratio": "removed in transformers 5: use warmup_steps with a float in [0, 1), the fraction of all steps",
    "overwrite_output_dir": "removed in transformers 5: a run writes into output_dir as it is; to continue a run use "
    "resume_from_checkpoint: auto, to start over a new output_dir",
    "max_prompt_length": "removed from TRL's GRPOConfig (1.x): prompts are used whole; drop the key, and bound "
    "prompt + completion with generation.max_model_len for a vLLM server",
    "evaluation_strategy": "renamed eval_strategy (transformers)",
    "per_gpu_train_batch_size": "renamed per_device_train_batch_size (transformers)",
    "dataset_prompt_column": "open-r1's name: use prompt_column (and solution_column for the gold answer)",
    "dataset_configs": "open-r1's list of dataset configs: use dataset_config with one config name",
    "vllm_device": "removed from TRL (GRPOConfig 0.16): vllm_mode: colocate puts vLLM on every training GPU; for "
    "vLLM on GPUs of its own use generation: {backend: vllm_server, gpus: [N]}",
    "wandb_project": "open-r1's key: use project (transformers 5), or WANDB_PROJECT in the environment",
    "wandb_entity": "open-r1's key: set WANDB_ENTITY in the environment",
    "wandb_run_group": "open-r1's key: set WANDB_RUN_GROUP in the environment",
    "callbacks": "open-r1's push_to_hub_revision callback: with push_to_hub: true hf_grpo pushes the adapter and its "
    "model card once training ends (python -m hf_grpo.publish.hub pushes a run later)",
    "benchmarks": "open-r1's lighteval benchmarks: held-out accuracy is measured in the run (eval_dataset_name, "
    "task_eval_steps); python -m hf_grpo.evaluate scores a saved run",
    "use_liger_loss": "renamed use_liger_kernel (TRL)",
    "chat_template": "not a recipe key here: the tokenizer's own chat template is used (prompt_style: plain or "
    "r1_zero for a prompt without one)",
}


def check_known_keys(keys: list, index: dict, options: bool = False) -> None:
    """Every unknown key at once, each with its replacement: a TRL or open-r1 recipe is fixed in one pass, not one
    refusal per key (``options``: the keys are command-line options, named ``--key``)."""
    unknown = [k for k in keys if k not in index]
    if not unknown:
        return
    named = [f"--{k}" if options else repr(k) for k in unknown]
    if len(unknown) == 1:
        raise RecipeError(
            f"unknown {'option' if options else 'key'} {named[0]}{did_you_mean(unknown[0], index, options)}"
        )
    items = " | ".join(f"{n}{did_you_mean(k, index, options)}" for n, k in zip(named, unknown, strict=True))
    raise RecipeError(f"{len(unknown)} unknown keys, each with its fix: {items}")


# Fields of TRL's other trainers' configs whose idea lives in a section here (checked before spelling).
ELSEWHERE_HERE = {
    "max_staleness": "generation.max_staleness (with generation.overlap: true)",
    "vllm_server_base_url": "generation.base_url",
    "vllm_server_timeout": "generation.server_timeout",
    "request_timeout": "generation.request_timeout",
    "weight_sync_steps": "generation.weight_sync (the server gets the adapter, or the weights, every step)",
    "max_inflight_tasks": "generation.overlap (the next cycle is generated while one trains)",
    "queue_maxsize": "generation.overlap (the next cycle is generated while one trains)",
}


@functools.cache
def trl_config_fields() -> dict[str, str]:
    """Field name -> the TRL config class (and module) that has it, over every ``*Config`` dataclass of the installed
    TRL, read from its source (nothing imported): what a recipe written for another TRL trainer may carry."""
    import trl

    root, fields = Path(trl.__file__).parent, {}
    for path in sorted(root.rglob("*config*.py"), key=lambda p: ("grpo" not in p.name, str(p))):  # GRPO's first
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        module = ".".join(("trl", *path.relative_to(root).with_suffix("").parts))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and node.name != "GRPOConfig":
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        fields.setdefault(item.target.id, f"{node.name} ({module})")
    return fields


def trl_version() -> str:
    return version("trl")


def did_you_mean(key: str, known, options: bool = False) -> str:
    if key in RENAMED:
        return f": {RENAMED[key]}"
    for section in NESTED:
        if key in nested_index(section):
            written = f"--{section}.{key} VALUE" if options else f"{section}: {{{key}: ...}}"
            return f": a key of the {section} section; write {written}"
    owner = trl_config_fields().get(key) if isinstance(key, str) else None
    if owner is not None:
        here = f"; here: {ELSEWHERE_HERE[key]}" if key in ELSEWHERE_HERE else ""
        return f": a field of TRL's {owner}, not of the GRPOConfig (TRL {trl_version()}) hf_grpo trains with{here}"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else "; see `python -m hf_grpo.train --help` for every key"
