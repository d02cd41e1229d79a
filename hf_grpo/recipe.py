"""Recipes: one flat YAML file per run, checked completely before any model is loaded.

A recipe's keys are the fields of ``ModelArguments``, ``DataArguments``, ``RewardArguments``, ``LaunchArguments`` and
``HfGRPOConfig`` (so every ``trl.GRPOConfig`` / ``transformers.TrainingArguments`` field), plus ``env`` (environment
variables to export, as TRL's parser does). Command-line overrides use the same names::

    python -m hf_grpo.train recipes/qwen7b.yaml --learning_rate 2e-6 --num_generations 8
    python -m hf_grpo.train --config recipes/qwen7b.yaml --lora_target_modules '[q_proj,v_proj]' --dry-run

An override value is read as a YAML scalar or flow sequence (``true``, ``1e-6``, ``[a, b]``, ``null``); dashes
and underscores in names are interchangeable; ``--flag`` alone sets a boolean to true.

Everything a user can get wrong fails here with ``RecipeError``, whose message names the key, the value and a fix:
unknown keys (with a did-you-mean), wrong types, missing files, and batch sizes that cannot form whole prompt
groups. ``hf_grpo.train`` turns it into exit code 2 with no traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import HfGRPOConfig, ModelArguments
from .data.loaders import LOCAL_BUILDERS, PRESETS, TRL_COLUMNS, DataArguments, is_local_file, source_splits
from .generation.layout import GenerationArguments, check_generation, trl_fields
from .hardware import MINIATURE_HINT, hardware_problems
from .launch import LaunchArguments, Layout, inside_launch, resolve_layout, shipped_dir
from .miniature import Miniature
from .rewards import RewardArguments, RewardLoadError, resolve_reward, reward_name
from .tokens import env_token


SECTIONS = {
    "model": ModelArguments,
    "data": DataArguments,
    "rewards": RewardArguments,
    "launch": LaunchArguments,
    "training": HfGRPOConfig,
}
NESTED = {"generation": GenerationArguments}  # sections written as a YAML mapping (``generation: {backend: ...}``)
DEFAULT_RECIPE = "tiny.yaml"
FLAGS = {"dry_run", "help", "miniature"}

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
# Whole segments of a variable name (HF_TOKEN, WANDB_API_KEY), so that TOKENIZERS_PARALLELISM is not a secret.
SECRET_ENV = re.compile(r"(?:^|_)(TOKENS?|KEYS?|APIKEY|SECRETS?|PASSWORDS?|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RecipeLoader(yaml.SafeLoader):
    """YAML 1.2 scalars: only true/false are booleans (``eval_strategy: no`` stays the string "no"), and ``1e-6``
    is a float (PyYAML's YAML 1.1 rules would read it as a string). A key given twice in one mapping is an error
    (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, typing.Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (also on line {seen[key]}); keep one", key_node.start_mark
                    )
                if isinstance(key, typing.Hashable):
                    seen[key] = line
        return super().construct_mapping(node, deep=deep)


RecipeLoader.yaml_implicit_resolvers = {
    key: [
        (tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")
    ]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)$|^[-+]?(?:\d+\.\d*|\.\d+)$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def load_yaml(text_or_stream):
    return yaml.load(text_or_stream, Loader=RecipeLoader)


class RecipeError(Exception):
    """A problem with a recipe or its overrides; the message says which key, which value and how to fix it."""


@dataclass
class BatchPlan:
    """How the batch sizes of a recipe fit together for a given number of processes."""

    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_generations: int

    @property
    def completions_per_generation(self) -> int:
        return self.per_device_train_batch_size * self.steps_per_generation * self.num_processes

    @property
    def prompts_per_generation(self) -> int:
        return self.completions_per_generation // self.num_generations

    @property
    def completions_per_optimizer_step(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_processes

    def describe(self) -> str:
        p = self
        per_proc = p.per_device_train_batch_size * p.steps_per_generation
        generation = (
            f"  generation:     {p.prompts_per_generation} prompts x {p.num_generations} num_generations = "
            f"{p.completions_per_generation} completions ({per_proc} per process = per_device_train_batch_size "
            f"{p.per_device_train_batch_size} x steps_per_generation {p.steps_per_generation})"
        )
        step = (
            f"  optimizer step: per_device_train_batch_size {p.per_device_train_batch_size} x "
            f"gradient_accumulation_steps {p.gradient_accumulation_steps} x {p.num_processes} processes = "
            f"{p.completions_per_optimizer_step} completions"
        )
        lines = [generation, step]
        ratio = p.steps_per_generation / p.gradient_accumulation_steps
        lines.append(f"  {ratio:g} optimizer step(s) per generation")
        return "\n".join(lines)


@dataclass
class Recipe:
    """A validated recipe: its explicit values, the argument dataclasses and the derived layout."""

    path: Path | None
    values: dict[str, Any]
    model: ModelArguments
    data: DataArguments
    rewards: RewardArguments
    launch: LaunchArguments
    training: HfGRPOConfig
    layout: Layout
    plan: BatchPlan
    generation: GenerationArguments = field(default_factory=GenerationArguments)
    env: dict[str, str] = field(default_factory=dict)
    miniature: Miniature | None = None  # set by --miniature: what was swapped (hf_grpo.miniature)
    hardware: list[str] = field(default_factory=list)  # what this machine cannot run (reported by --dry-run)
    sources: dict[str, str] = field(default_factory=dict)  # where each value in ``values`` came from (--dry-run)


# Numeric domains: key -> (low, low included, high, high included); None is unbounded. A key set to None is unset.
AT_LEAST_1 = (1, True, None, False)
POSITIVE = (0, False, None, False)
NON_NEGATIVE = (0, True, None, False)
DOMAINS = {
    **dict.fromkeys(
        (
            "max_completion_length", "lora_r", "arithmetic_train_size", "arithmetic_eval_size", "num_processes",
            "num_machines", "max_generation_batches", "num_iterations", "max_train_samples", "max_eval_samples",
            "task_eval_max_samples", "eval_max_new_tokens", "keep_top_k", "tiny_hidden_size",
            "per_device_eval_batch_size", "num_generations_eval", "generation_batch_size", "steps_per_generation",
            "reward_workers", "vllm_tensor_parallel_size", "save_total_limit",
        ),
        AT_LEAST_1,
    ),
    **dict.fromkeys(
        ("temperature", "lora_alpha", "reward_timeout", "repetition_penalty", "warm_start_lr", "save_steps"),
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
    "top_p": (0, False, 1, True),
    "min_p": (0, True, 1, True),
    "vllm_gpu_memory_utilization": (0, False, 1, True),
    "adam_beta1": (0, True, 1, False),
    "adam_beta2": (0, True, 1, False),
}  # fmt: skip


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


def _check_domain(key: str, value: Any, default: Any, where: str) -> None:
    """Refuse a number outside the key's domain (NaN and infinities included), before anything is built."""
    for number in value if isinstance(value, list) else [value]:
        if isinstance(number, float) and not math.isfinite(number):
            raise RecipeError(f"{where}: {key} must be a finite number, got {number!r}; write a number such as 1.0")
    domain = DOMAINS.get(key)
    if domain is None or not _is_number(value) or _inside(value, domain):
        return
    rule = _describe_domain(domain)
    if _is_number(default) and _inside(default, domain):
        fix = f"set {key}: {default!r} (its default) or another value {rule}"
    else:
        fix = f"set a value {rule}, or remove {key}"
    raise RecipeError(f"{where}: {key} must be {rule}, got {value!r}; {fix}")


# ---------------------------------------------------------------------------------------------------------------------
# Field index and type checking


def field_index() -> dict[str, tuple[str, dataclasses.Field, Any]]:
    """Every recipe key: name -> (section, dataclass field, resolved type hint)."""
    index = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                index[f.name] = (section, f, hints[f.name])
    return index


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """(matches, coerced value) of ``value`` against a type hint."""
    if hint is Any:
        return True, value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            ok, coerced = _coerce(value, arg)
            if ok:
                return True, coerced
        return False, value
    if origin is typing.Literal:
        return value in typing.get_args(hint), value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, value
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):  # a quoted number such as "1e-6"
            return True, float(value)
        return False, value
    if hint is str:
        return isinstance(value, str), value
    if origin in (list, tuple) or hint in (list, tuple):
        (item_hint,) = typing.get_args(hint) or (Any,)
        items = value if isinstance(value, list) else [value] if isinstance(value, str) else None
        if items is None:
            return False, value
        coerced = []
        for item in items:
            ok, c = _coerce(item, item_hint)
            if not ok:
                return False, value
            coerced.append(c)
        return True, coerced
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
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


def check_value(key: str, value: Any, hint: Any, f: dataclasses.Field, where: str) -> Any:
    """Type-check and coerce one value; RecipeError names the key, the value and the expected type."""
    if key in SECRET_KEYS and value is not None:
        raise RecipeError(f"{where}: {key} must not be set in a recipe; export HF_TOKEN in the environment instead")
    ok, coerced = _coerce(value, hint)
    if not ok and isinstance(value, str) and _coerce(1.0, hint)[0] and _non_finite_text(value):
        raise RecipeError(f"{where}: {key} must be a finite number, got {value!r}; set a finite {key}")
    if not ok:
        hint_text = ""
        if isinstance(value, bool) and _coerce("x", hint)[0]:
            hint_text = (
                f" (YAML reads an unquoted yes/no/true/false as a boolean; write {key}: '{str(value).lower()}')"
            )
        raise RecipeError(
            f"{where}: {key} must be {_type_name(hint)}, got {value!r} ({type(value).__name__}){hint_text}"
        )
    enums = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, enum.Enum)]
    choices = f.metadata.get("choices") or KNOWN_CHOICES.get(key)
    if enums and isinstance(coerced, str):  # `IntervalStrategy | str` accepts any string, TrainingArguments does not
        choices = [m.value for m in enums[0]]
    if choices is not None and coerced is not None and coerced not in choices:
        raise RecipeError(f"{where}: {key} must be one of {list(choices)}, got {coerced!r}")
    _check_domain(key, coerced, f.default, where)
    return coerced


def nested_index(section: str) -> dict[str, tuple[dataclasses.Field, Any]]:
    cls = NESTED[section]
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def check_nested(section: str, key: str, value: Any, where: str) -> Any:
    known = nested_index(section)
    if not isinstance(key, str):
        raise RecipeError(f"{where}: key {key!r} in {section} is not a name; see `python -m hf_grpo.train --help`")
    if key not in known:
        raise RecipeError(f"{where}: unknown key {section}.{key}{did_you_mean(key, known)}")
    f, hint = known[key]
    return check_value(f"{section}.{key}", value, hint, f, where)


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
    "model card once training ends (python -m hf_grpo.hub pushes a run later)",
    "benchmarks": "open-r1's lighteval benchmarks: held-out accuracy is measured in the run (eval_dataset_name, "
    "task_eval_steps); python -m hf_grpo.evaluate scores a saved run",
    "use_liger_loss": "renamed use_liger_kernel (TRL)",
    "chat_template": "not a recipe key here: the tokenizer's own chat template is used (prompt_style: plain or "
    "r1_zero for a prompt without one)",
}


def _check_known_keys(keys: list, index: dict, where: str) -> None:
    """Every unknown key at once, each with its replacement: a TRL or open-r1 recipe is fixed in one pass, not one
    refusal per key."""
    unknown = [k for k in keys if k not in index]
    if not unknown:
        return
    named = [f"--{k}" if where == "command line" else repr(k) for k in unknown]
    if len(unknown) == 1:
        what = "option" if where == "command line" else "key"
        raise RecipeError(f"{where}: unknown {what} {named[0]}{did_you_mean(unknown[0], index)}")
    items = " | ".join(f"{n}{did_you_mean(k, index)}" for n, k in zip(named, unknown, strict=True))
    raise RecipeError(f"{where}: {len(unknown)} unknown keys, each with its fix: {items}")


def did_you_mean(key: str, known) -> str:
    if key in RENAMED:
        return f": {RENAMED[key]}"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else "; see `python -m hf_grpo.train --help` for every key"


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def _takes_list(name: str) -> bool:
    """Whether the recipe key ``name`` (``section.key`` for a nested one) holds a list."""
    section, dot, sub = name.partition(".")
    if dot and section in NESTED:
        hint = nested_index(section).get(sub, (None, None))[1]
    else:
        hint = field_index().get(name, (None, None, None))[2]
    return any(typing.get_origin(t) is list for t in (hint, *typing.get_args(hint)))


def split_argv(argv: list[str]) -> tuple[str | None, dict[str, str | None], set[str]]:
    """(recipe path, raw overrides, flags) from ``[recipe.yaml] [--config X] [--key value ...] [--dry-run]``."""
    path, overrides, flags = None, {}, set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            if arg == "-h":
                flags.add("help")
            elif path is None:
                path = arg
            else:
                raise RecipeError(f"unexpected argument {arg!r}; options look like --key value")
            i += 1
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name in FLAGS:
            flags.add(name)
        elif name == "config":
            if not eq:
                if i + 1 >= len(argv):
                    raise RecipeError("--config needs a recipe path")
                value, i = argv[i + 1], i + 1
            path = value
        elif eq:
            overrides[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            overrides[name], i = argv[i + 1], i + 1
            items = [overrides[name]]
            while _takes_list(name) and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                if path is None and argv[i + 1].endswith((".yaml", ".yml")):
                    break  # the recipe after a list option: `--lora_target_modules q_proj v_proj recipe.yaml`
                items, i = [*items, argv[i + 1]], i + 1  # `--reward_funcs a b`, as TRL's --help shows lists
            if len(items) > 1:
                overrides[name] = "[" + ", ".join(items) + "]"
        else:
            overrides[name] = None  # bare flag
        i += 1
    return path, overrides, flags


def _parse_override(key: str, raw: str | None, hint: Any = None) -> Any:
    """A command-line value read as YAML; a malformed ``[list]`` or ``{mapping}`` for a field that takes one is an
    error (read as a plain string, ``'[q_proj,'`` would become a module name)."""
    if raw is None:
        return True
    try:
        return load_yaml(raw) if raw.strip() else raw
    except yaml.YAMLError as exc:
        takes_collection = hint is not None and (_coerce([], hint)[0] or _coerce({}, hint)[0])
        if takes_collection and raw.lstrip().startswith(("[", "{")):
            raise RecipeError(
                f"command line --{key}: {raw!r} is not a valid YAML list or mapping ({getattr(exc, 'problem', exc)}); "
                f"write it as --{key} '[a, b]'"
            ) from None
        return raw


# ---------------------------------------------------------------------------------------------------------------------
# Loading


def default_recipe_path() -> Path:
    return shipped_dir("recipes") / DEFAULT_RECIPE


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise RecipeError(f"recipe path {str(path)!r} is a directory; pass a recipe file such as {path}/tiny.yaml")
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist; pass a path such as recipes/tiny.yaml")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); a recipe is YAML text saved as UTF-8"
        ) from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot be read: {exc.strerror}") from None


def read_yaml(path: Path) -> dict:
    text = _read_text(path)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise RecipeError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None or data == {}:
        raise RecipeError(
            f"{path}: the recipe is empty (no key: value lines); write at least model_name_or_path, or run "
            "`python -m hf_grpo.train` with no recipe for the tiny default"
        )
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping of key: value, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise RecipeError(f"{path}: key {key!r} is not a name; recipe keys are field names such as learning_rate")
    return data


def _check_env(env: Any, where: str) -> dict[str, str]:
    if not isinstance(env, dict):
        raise RecipeError(f"{where}: env must be a mapping of VARIABLE: value")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise RecipeError(f"{where}: env.{name} is not an environment variable name (letters, digits and _)")
        if SECRET_ENV.search(name):
            raise RecipeError(f"{where}: env.{name} looks like a secret; export it in the shell, not in a recipe")
        if isinstance(value, (dict, list)) or value is None:
            raise RecipeError(f"{where}: env.{name} must be a string, number or boolean, got {value!r}")
    return {k: str(v) for k, v in env.items()}


# File suffixes that name a data file the ``datasets`` builders of hf_grpo do not read (a hub id has none of them).
UNREADABLE_DATA_SUFFIXES = (".txt", ".tsv", ".xlsx", ".xls", ".arrow", ".yaml", ".yml", ".xml", ".zip", ".gz", ".tar")


def _check_dataset_file(key: str, name: Any, where: str) -> None:
    if not isinstance(name, str):
        return
    if is_local_file(name):
        if not Path(name).expanduser().is_file():
            raise RecipeError(f"{where}: {key}: local file {name!r} does not exist")
        return
    suffix = os.path.splitext(name)[1].lower()
    if suffix in UNREADABLE_DATA_SUFFIXES or (suffix and Path(name).expanduser().is_file()):
        raise RecipeError(
            f"{where}: {key}: {name!r} is a {suffix or 'local'} file, which cannot be read as a dataset; convert it "
            f"to one of {sorted(LOCAL_BUILDERS)} (one problem per row, with a problem and a gold answer column)"
        )


def _check_output_dir(output_dir: Any, where: str) -> None:
    """``output_dir`` (or the nearest of its parents that exists) must be a directory: mkdir fails after loading."""
    if not isinstance(output_dir, str):
        return
    path = Path(output_dir).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "is an existing file" if existing == path else f"is under {str(existing)!r}, which is a file"
        raise RecipeError(f"{where}: output_dir {output_dir!r} {what}; choose a directory path such as outputs/run")


def _check_files(values: dict, base_dir: Path, where: str, built_later: set[str] = frozenset()) -> None:
    for key in ("dataset_name", "eval_dataset_name"):
        _check_dataset_file(key, values.get(key), where)
    model = values.get("model_name_or_path")
    local = isinstance(model, str) and model.startswith(("./", "../", "/", "~"))
    if local and model not in built_later and not Path(model).expanduser().exists():
        raise RecipeError(f"{where}: model_name_or_path: local path {model!r} does not exist")
    _check_output_dir(values.get("output_dir"), where)
    deepspeed = values.get("deepspeed")
    if isinstance(deepspeed, str) and not Path(deepspeed).expanduser().is_file():
        raise RecipeError(f"{where}: deepspeed: config file {deepspeed!r} does not exist")
    resume = values.get("resume_from_checkpoint")
    if isinstance(resume, str) and resume.lower() not in ("true", "auto") and not Path(resume).expanduser().exists():
        raise RecipeError(f"{where}: resume_from_checkpoint: {resume!r} does not exist")
    for name in values.get("reward_funcs") or []:
        try:
            resolve_reward(name)
        except RewardLoadError as exc:
            raise RecipeError(f"{where}: {exc}") from None
    kwargs = values.get("reward_kwargs") or {}
    unknown = set(kwargs) - set(values.get("reward_funcs") or RewardArguments().reward_funcs)
    if unknown:
        raise RecipeError(f"{where}: reward_kwargs names {sorted(unknown)}, which are not in reward_funcs")


# Correctness rewards that fix how gold answers are graded, for a dataset with no preset and no ``task``: TRL's
# accuracy rewards parse the gold with math-verify as MATH does.
TASK_OF_REWARD = {
    "math_correctness": "math",
    "r1_zero_correctness": "math",
    "accuracy_reward": "math",
    "reasoning_accuracy_reward": "math",
    "gsm8k_correctness": "gsm8k",
}


def infer_task(data: DataArguments, reward_funcs: list[str]) -> str | None:
    """The task a recipe without one implies: the one its correctness rewards agree on (None when unset or unclear)."""
    if data.resolved()["task"] is not None:
        return None
    tasks = {TASK_OF_REWARD.get(reward_name(n)) for n in reward_funcs} - {None}
    return tasks.pop() if len(tasks) == 1 else None


def _check_data(data: DataArguments, where: str) -> None:
    """The grader and the columns of the dataset are known before anything loads."""
    from .rewards.grading import TASKS

    if data.dataset_streaming:
        raise RecipeError(
            f"{where}: dataset_streaming is not supported; use max_train_samples to bound a large dataset"
        )
    for name in filter(None, (data.dataset_name, data.eval_dataset_name)):
        spec = data.resolved(None if name == data.dataset_name else name)
        if spec["task"] not in TASKS:
            raise RecipeError(
                f"{where}: dataset {name!r} needs task: one of {list(TASKS)} (how gold answers are graded); "
                f"got {spec['task']!r}"
            )
        if not is_local_file(name):
            continue  # a hub dataset's columns are checked when it loads, before the model (hf_grpo.train.run)
        columns = _local_columns(name)
        for key in ("prompt_column", "solution_column"):
            default = TRL_COLUMNS[key]  # a dataset in TRL's format: used when the data has the column
            if spec[key] is None and default not in columns:
                raise RecipeError(
                    f"{where}: dataset {name!r} has no {default!r} column (TRL's name), so set {key} to the column "
                    f"that holds it{f'; columns: {sorted(columns)}' if columns else ''}"
                )


def _local_columns(path: str) -> set[str]:
    """The columns of a local JSON Lines / JSON / CSV file, from its first record (empty when unknown)."""
    import csv
    import json

    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            if path.endswith(".csv"):
                return set(next(csv.reader(f), []))
            first = f.readline().strip()
            record = json.loads(first) if path.endswith(".jsonl") else None
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    return set(record) if isinstance(record, dict) else set()


LORA_KEYS = (
    "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save",
    "lora_task_type", "use_rslora", "use_dora",
)  # fmt: skip


def _check_lora_keys(values: dict, in_file: set[str], on_command_line: set[str], where: str) -> None:
    """LoRA keys do nothing without use_peft: true. ``--use_peft false`` on the command line turns a LoRA recipe into
    full fine-tuning, so only LoRA keys from the same place as (or a later place than) use_peft: false are refused."""
    if values.get("use_peft", False):
        return
    ignored = on_command_line if "use_peft" in on_command_line else in_file | on_command_line
    lora = [key for key in LORA_KEYS if key in ignored]
    if lora:
        state = "use_peft: false" if "use_peft" in values else "use_peft is false (the default)"
        raise RecipeError(
            f"{where}: {lora[0]} is set but {state}, so the LoRA settings {lora} would be ignored; set use_peft: true "
            "to train a LoRA adapter, or remove them for full fine-tuning"
        )


INTERVALS = {"save_steps": "save_strategy", "logging_steps": "logging_strategy", "eval_steps": "eval_strategy"}


def _check_intervals(values: dict, where: str) -> None:
    """A ``*_strategy: steps`` needs a positive interval (``0`` makes transformers divide by zero mid-run)."""
    index = field_index()
    for key, strategy_key in INTERVALS.items():
        strategy = values.get(strategy_key, index[strategy_key][1].default)
        value = values.get(key, index[key][1].default)
        if str(getattr(strategy, "value", strategy)) == "steps" and value is not None and value <= 0:
            raise RecipeError(
                f"{where}: {key} must be > 0 with {strategy_key}: steps, got {value!r}; set {key} to a number of "
                f"steps (or a fraction of the run below 1), or set {strategy_key}: 'no'"
            )


TRACKER_PACKAGES = {"tensorboard": "tensorboard", "azure_ml": "azureml-core", "flyte": "flytekit"}


def _check_report_to(values: dict, where: str) -> None:
    """Each tracker is one transformers knows, and its package is installed (both fail only once training starts)."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    report_to = values.get("report_to")
    trackers = [report_to] if isinstance(report_to, str) else list(report_to or [])
    known = [*INTEGRATION_TO_CALLBACK, "all", "none"]
    for tracker in trackers:
        if tracker not in known:
            close = difflib.get_close_matches(str(tracker), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RecipeError(f"{where}: report_to: unknown tracker {tracker!r}; {hint}known: {sorted(known)}")
        if tracker not in ("all", "none") and tracker not in get_available_reporting_integrations():
            package = TRACKER_PACKAGES.get(tracker, tracker.replace("_", "-"))
            raise RecipeError(
                f"{where}: report_to: {tracker!r} needs the {package} package, which is not installed; "
                f"pip install {package}, or remove {tracker} from report_to"
            )


def _check_push(values: dict, env: dict[str, str], where: str) -> None:
    """What the push after training needs, checked before it: a repo id, a token, the Hub reachable, one push."""

    if not values.get("hub_model_id"):
        raise RecipeError(
            f"{where}: push_to_hub needs hub_model_id (e.g. your-name/qwen7b-grpo); the token comes "
            "from the HF_TOKEN environment variable"
        )
    if env_token() is None:
        raise RecipeError(
            f"{where}: push_to_hub: true but there is no Hugging Face token in the environment, so the push after "
            "training would fail: export HF_TOKEN=hf_... (write access) before the run, or set push_to_hub: false"
        )
    offline = [name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if _is_set(name, env)]
    if offline:
        raise RecipeError(
            f"{where}: push_to_hub: true but {offline[0]} is set, so the push after training would fail: unset it "
            "(and load the model and data from local paths), or set push_to_hub: false"
        )
    strategy = values.get("hub_strategy")
    if strategy is not None and str(strategy) not in ("end", "HubStrategy.END"):
        raise RecipeError(
            f"{where}: hub_strategy: {strategy} is not supported: hf_grpo pushes once, at the end, with the held-out "
            "results in the model card; remove hub_strategy (or set it to end)"
        )


def _is_set(name: str, env: dict[str, str]) -> bool:
    return env.get(name, os.environ.get(name, "")).strip().lower() in ("1", "true", "yes", "on")


def _dataset_cached(name: str) -> bool:
    from datasets import config as datasets_config
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}"
    prepared = Path(datasets_config.HF_DATASETS_CACHE) / name.replace("/", "___")
    return hub.is_dir() or prepared.is_dir()


def _check_offline(data: DataArguments, env: dict[str, str], where: str) -> None:
    """Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), a hub dataset other than a preset must be mirrored locally or
    already cached (a preset's splits are checked when they load: ``--miniature`` mirrors them)."""
    if not (_is_set("HF_HUB_OFFLINE", env) or _is_set("HF_DATASETS_OFFLINE", env)):
        return
    mirror = data.dataset_mirror or {}
    for spec, split in source_splits(data).values():
        name = spec["name"]
        if name in PRESETS or is_local_file(name) or f"{name}:{split}" in mirror or _dataset_cached(name):
            continue
        key = "dataset_name" if name == data.resolved()["name"] else "eval_dataset_name"
        raise RecipeError(
            f"{where}: {key}: hub dataset {name!r} (split {split!r}) cannot be downloaded offline (HF_HUB_OFFLINE or "
            f"HF_DATASETS_OFFLINE is set) and is not cached; unset the variable, use a local file, or map "
            f"'{name}:{split}' to one in dataset_mirror"
        )


def _known_train_rows(data: DataArguments) -> tuple[int, str] | None:
    """(at most how many training rows there are, which key says so), when the recipe alone tells."""
    bounds = []
    if data.resolved()["name"] == "arithmetic":
        bounds.append((data.arithmetic_train_size, "arithmetic_train_size"))
    if data.max_train_samples is not None:
        bounds.append((data.max_train_samples, "max_train_samples"))
    return min(bounds) if bounds else None


def _check_steps(values: dict, plan: BatchPlan, data: DataArguments, where: str) -> None:
    """A run that would make no optimizer step (it would exit 0 having trained nothing) is an error."""
    index = field_index()
    max_steps = values.get("max_steps", index["max_steps"][1].default)
    epochs = values.get("num_train_epochs", index["num_train_epochs"][1].default)
    if max_steps == 0 or (max_steps < 0 and epochs <= 0):
        raise RecipeError(
            f"{where}: max_steps {max_steps} with num_train_epochs {epochs} makes 0 optimizer steps; set max_steps "
            "to a positive number of steps, or num_train_epochs > 0"
        )
    known = _known_train_rows(data)
    if known is not None and plan.prompts_per_generation > known[0]:
        rows, key = known
        raise RecipeError(
            f"{where}: per_device_train_batch_size {plan.per_device_train_batch_size}: one generation needs "
            f"{plan.prompts_per_generation} prompts ({plan.completions_per_generation} completions / num_generations "
            f"{plan.num_generations}) but the training data has at most {rows} rows ({key}), so the run would make 0 "
            "optimizer steps; lower per_device_train_batch_size (or steps_per_generation), or use more data"
        )


def _module_names(model: ModelArguments, trust_remote_code: bool) -> dict[str, bool] | None:
    """The module names of the policy (name -> whether it is a leaf), built on the meta device from its config (no weights); None when its config
    is not on this machine (a hub model not yet downloaded)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    name = model.model_name_or_path
    if name == "tiny":
        config = Qwen2Config(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    else:
        try:
            config = AutoConfig.from_pretrained(
                name, revision=model.model_revision, local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError):  # not downloaded (or needs remote code): checked when the model loads
            return None
    try:
        with init_empty_weights():
            built = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, ImportError, OSError):  # an architecture this transformers cannot build
        return None
    return {name: not any(module.children()) for name, module in built.named_modules()}


def _check_lora_targets(model: ModelArguments, values: dict, where: str, built_later: set) -> None:
    """Each ``lora_target_modules`` entry matches a module of the policy (checked on a meta-device copy)."""
    targets = model.lora_target_modules
    if (
        not model.use_peft
        or targets in (None, "all-linear", ["all-linear"])
        or model.model_name_or_path in built_later
    ):
        return
    names = _module_names(model, bool(values.get("trust_remote_code")))
    if names is None:
        return
    if isinstance(targets, str):
        try:
            if any(re.fullmatch(targets, n) for n in names):
                return
        except re.error as exc:
            raise RecipeError(f"{where}: lora_target_modules: {targets!r} is not a valid regex ({exc})") from None
        targets = [targets]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, leaf in names.items() if leaf})
        close = difflib.get_close_matches(missing[0], leaves, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RecipeError(
            f"{where}: lora_target_modules: {missing} match no module of {model.model_name_or_path}; {hint}its "
            f"layers are {leaves}, or write lora_target_modules: all-linear"
        )


HALF_DTYPES = ("bfloat16", "float16")


def _check_precision(values: dict, model: ModelArguments, layout: Layout, where: str) -> None:
    """Full fine-tuning of half-precision weights needs fp32 master weights, which only DeepSpeed keeps.

    Plain AdamW (or FSDP2, which keeps the loaded dtype) steps bf16 parameters in place: an update smaller than half
    a bf16 ulp of the weight (~0.4% of its value) rounds away, so at a fine-tuning learning rate most updates are
    lost. LoRA adapters are created in fp32 by PEFT, so a LoRA recipe may load a bf16 base.
    """
    if model.use_peft or model.dtype not in HALF_DTYPES or layout.distributed_type == "DEEPSPEED":
        return
    raise RecipeError(
        f"{where}: dtype: {model.dtype} with use_peft: false trains {model.dtype} weights without fp32 master "
        f"weights (only DeepSpeed keeps them), so updates smaller than the weights' rounding step are lost; set "
        f"dtype: float32 and keep bf16: true (mixed precision: bf16 compute, fp32 weights and optimizer), or use a "
        "DeepSpeed accelerate_config"
    )


def batch_plan(values: dict, num_processes: int, where: str) -> BatchPlan:
    """Batch arithmetic for ``num_processes``; RecipeError when it cannot form whole prompt groups."""
    defaults = {f.name: f.default for f in dataclasses.fields(HfGRPOConfig)}

    def get(key):
        return values.get(key, defaults[key])

    pdb, ga, g = get("per_device_train_batch_size"), get("gradient_accumulation_steps"), get("num_generations")
    spg, gbs = get("steps_per_generation"), get("generation_batch_size")
    for key, value in (
        ("per_device_train_batch_size", pdb),
        ("gradient_accumulation_steps", ga),
        ("num_generations", g),
    ):
        if value is None or value < 1:
            raise RecipeError(f"{where}: {key} must be a positive integer, got {value!r}")
    if g < 2:
        raise RecipeError(f"{where}: num_generations must be at least 2 (GRPO compares completions), got {g}")
    global_batch = pdb * num_processes
    if spg is not None and gbs is not None:
        raise RecipeError(
            f"{where}: set generation_batch_size or steps_per_generation, not both (got {gbs} and {spg})"
        )
    if gbs is not None:
        if gbs % global_batch:
            raise RecipeError(
                f"{where}: generation_batch_size {gbs} is not divisible by per_device_train_batch_size {pdb} x "
                f"{num_processes} processes = {global_batch}; use a multiple of {global_batch}"
            )
        spg = gbs // global_batch
    spg = spg or ga
    plan = BatchPlan(num_processes, pdb, ga, spg, g)
    if plan.completions_per_generation % g:
        multiple = g // _gcd(g, num_processes)
        raise RecipeError(
            f"{where}: completions per generation ({pdb} per device x {spg} steps_per_generation x {num_processes} "
            f"processes = {plan.completions_per_generation}) is not divisible by num_generations {g}; make "
            f"per_device_train_batch_size x steps_per_generation a multiple of {multiple}, or change num_generations"
        )
    if get("dynamic_sampling") and (pdb * spg) % g:
        raise RecipeError(
            f"{where}: dynamic_sampling keeps or drops whole prompt groups on each process, so "
            f"per_device_train_batch_size x steps_per_generation ({pdb} x {spg} = {pdb * spg}) must be a multiple "
            f"of num_generations {g}"
        )
    eval_strategy = get("eval_strategy")
    if eval_strategy not in ("no", None):
        g_eval = get("num_generations_eval") or g
        pde = get("per_device_eval_batch_size")
        if (pde * num_processes) % g_eval:
            raise RecipeError(
                f"{where}: eval batch per_device_eval_batch_size {pde} x {num_processes} processes is not "
                f"divisible by num_generations_eval {g_eval}; set per_device_eval_batch_size to a multiple of {g_eval}"
            )
    return plan


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def section_values(values: dict, section: str) -> dict:
    index = field_index()
    return {k: v for k, v in values.items() if k in index and index[k][0] == section}


def _build(section: str, values: dict, where: str):
    cls, kwargs = SECTIONS[section], section_values(values, section)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{where}: {exc}") from None


def _validation_training_values(values: dict, plan: BatchPlan) -> dict:
    """Training values with hardware-bound settings neutralised, to run TRL's checks on a machine of any kind.

    TRL derives the generation batch from the current world size (1 here); the recipe's own layout is checked by
    ``batch_plan``, so the copy gets the planned generation batch directly.
    """
    checked = section_values(values, "training")
    checked.update(bf16=False, fp16=False, use_cpu=True, deepspeed=None, fsdp=None, use_vllm=False)
    checked.update(generation_batch_size=plan.completions_per_generation, steps_per_generation=None)
    checked.pop("fsdp_config", None)
    return checked


def load_recipe(argv: list[str], for_run: bool = True) -> tuple[Recipe, set[str]]:
    """Parse ``argv`` into a validated Recipe and the flags given (``dry_run``, ``help``).

    ``for_run=False`` (dry runs) builds the training config with hardware-bound settings neutralised, so a GPU
    recipe can be checked on a laptop; the batch arithmetic always uses the recipe's own process layout.
    """
    path_arg, raw_overrides, flags = split_argv(argv)
    model_override = raw_overrides.get("model_name_or_path")
    if not path_arg and model_override not in (None, "tiny"):
        raise RecipeError(
            f"--model_name_or_path {model_override} without a recipe would take the embedded tiny recipe's learning "
            "rate, lengths, batch and LoRA: start from a recipe in recipes/ (e.g. `python -m hf_grpo.train "
            f"recipes/qwen7b.yaml --model_name_or_path {model_override}`) or write your own"
        )
    path = Path(path_arg) if path_arg else default_recipe_path()
    where = str(path)
    from_file = str(path) if path_arg else f"tiny default ({DEFAULT_RECIPE}, no recipe given)"
    data = read_yaml(path)
    env = _check_env(data.pop("env", {}) or {}, where)
    index = field_index()

    values: dict[str, Any] = {}
    nested: dict[str, dict] = {section: {} for section in NESTED}
    _check_known_keys([k for k in data if k not in NESTED], index, where)
    _check_known_keys([k for k in raw_overrides if k.partition(".")[0] not in NESTED], index, "command line")
    for key, value in data.items():
        if key in NESTED:
            if not isinstance(value, dict):
                raise RecipeError(f"{where}: {key} must be a mapping of key: value")
            nested[key] = {k: check_nested(key, k, v, where) for k, v in value.items()}
            continue
        _, f, hint = index[key]
        values[key] = check_value(key, value, hint, f, where)
    for key, raw in raw_overrides.items():
        section, dot, sub = key.partition(".")
        if dot and section in NESTED:
            f, hint = nested_index(section).get(sub, (None, None))
            parsed = _parse_override(key, raw, hint)
            if hint is not None and not _coerce(parsed, hint)[0] and raw is not None and _coerce(raw, hint)[0]:
                parsed = raw
            nested[section][sub] = check_nested(section, sub, parsed, f"command line --{key}")
            continue
        _, f, hint = index[key]
        parsed = _parse_override(key, raw, hint)
        if not _coerce(parsed, hint)[0] and raw is not None and _coerce(raw, hint)[0]:
            parsed = raw  # a string field given something YAML reads as another type, e.g. `--run_name 2024`
        values[key] = check_value(key, parsed, hint, f, f"command line --{key}")
    if raw_overrides:  # the checks below span several keys: say which of them the command line set
        given = " ".join(f"--{key}" for key in raw_overrides)
        where = f"{where} (with {given} from the command line)"
    sources = {key: "command line" if key in raw_overrides else from_file for key in values}
    sources.update({key: from_file for key in NESTED if nested[key]})
    sources.update({key: "command line" for key in raw_overrides if key.partition(".")[0] in NESTED})
    _check_lora_keys(values, set(data), set(raw_overrides), where)
    _check_intervals(values, where)
    _check_report_to(values, where)
    reward_funcs = _build("rewards", values, where).reward_funcs
    inferred = infer_task(_build("data", values, where), reward_funcs)
    if inferred is not None:  # before --miniature, which mirrors the dataset in the task's answer format
        values["task"] = inferred
        sources["task"] = f"inferred from reward_funcs ({', '.join(reward_funcs)})"

    miniature = None
    if "miniature" in flags:
        from .miniature import miniaturize

        try:
            values, nested["generation"], miniature = miniaturize(values, nested["generation"], set(raw_overrides))
        except ValueError as exc:
            raise RecipeError(f"{where}: --miniature: {exc}") from None
        where = f"{where} (miniature)"
        sources.update({swap.key: "--miniature" for swap in miniature.swaps})
    built_later = {values.get("model_name_or_path")} if miniature is not None and miniature.assets else set()
    _check_files(values, path.parent, where, built_later)
    launch = _build("launch", values, where)
    try:
        layout = resolve_layout(launch, path.parent)
    except FileNotFoundError as exc:
        raise RecipeError(f"{where}: {exc}") from None
    if miniature is not None and "--mixed_precision" in miniature.accelerate_args:
        layout.mixed_precision = miniature.accelerate_args[miniature.accelerate_args.index("--mixed_precision") + 1]
    plan = batch_plan(values, layout.num_processes, where)
    model = _build("model", values, where)
    targets = values.get("lora_target_modules")
    if isinstance(targets, list):  # trl.ModelConfig makes ["q_proj"] the regex "q_proj", which PEFT matches against
        # full names only; PEFT's "all-linear" works only as a string
        model.lora_target_modules = "all-linear" if targets == ["all-linear"] else list(targets)
    data_args = _build("data", values, where)
    rewards = _build("rewards", values, where)
    _check_data(data_args, where)
    _check_offline(data_args, {**(miniature.env if miniature is not None else {}), **env}, where)
    _check_steps(values, plan, data_args, where)
    _check_lora_targets(model, values, where, built_later)
    reward_names = [reward_name(n) for n in rewards.reward_funcs]
    metric = values.get("dynamic_sampling_metric", "reward")
    if metric != "reward" and metric not in reward_names:
        raise RecipeError(
            f"{where}: dynamic_sampling_metric {metric!r} is neither 'reward' nor one of the "
            f"reward_funcs {reward_names}"
        )
    if values.get("push_to_hub"):
        _check_push(values, env, where)
    weights = values.get("reward_weights")
    if weights is not None and len(weights) != len(rewards.reward_funcs):
        raise RecipeError(
            f"{where}: reward_weights has {len(weights)} entries but reward_funcs has "
            f"{len(rewards.reward_funcs)}; give one weight per reward"
        )

    generation = GenerationArguments(**nested["generation"])
    problems = check_generation(generation, model.use_peft, model.lora_r, set(values))
    if generation.backend == "vllm_server" and generation.sync_mode(model.use_peft) == "lora":
        # what vLLM's adapter loader refuses (hf_grpo.miniature.vllm_server.unsupported_lora_features): caught here,
        # not at the first weight sync after the model has loaded
        if model.use_dora:
            problems.append("use_dora: true: vLLM cannot hot-load DoRA adapters; set use_dora: false")
        if model.lora_modules_to_save:
            problems.append(
                f"lora_modules_to_save: {model.lora_modules_to_save}: vLLM loads adapters only with "
                "modules_to_save None; remove it, or use generation.weight_sync: full"
            )
    if problems:
        raise RecipeError(f"{where}: " + "; ".join(problems))
    _check_precision(values, model, layout, where)
    defaults = {k: f.default for k, (_, f, _) in field_index().items() if f.default is not dataclasses.MISSING}
    hardware = hardware_problems(values, defaults, layout, generation, vllm_standin=miniature is not None)
    if hardware and for_run:
        hint = "" if miniature is not None else f"; {MINIATURE_HINT}"
        raise RecipeError(f"{where}: this machine cannot run it: " + " | ".join(hardware) + hint)

    # The config trains only in the process that runs it: a dry run, or the launcher of several processes (whose
    # world size is not the run's), checks it with the planned batch and hardware-bound settings neutralised.
    trains_here = for_run and (inside_launch() or layout.num_processes == 1)
    training_values = section_values(values, "training") if trains_here else _validation_training_values(values, plan)
    generated = trl_fields(generation, model.use_peft)
    training_values.update(generated if trains_here else {k: v for k, v in generated.items() if k != "use_vllm"})
    try:
        training = HfGRPOConfig(**training_values)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{where}: {exc}") from None
    if nested["generation"]:
        values["generation"] = nested["generation"]
    recipe = Recipe(
        path,
        values,
        model,
        data_args,
        rewards,
        launch,
        training,
        layout,
        plan,
        generation,
        env,
        miniature,
        hardware,
        sources,
    )
    if miniature is not None:
        recipe.env = {**miniature.env, **env}
        if for_run and miniature.assets is not None:
            from .miniature.assets import ensure_assets

            ensure_assets(miniature.assets)
    return recipe, flags


def apply_env(recipe: Recipe) -> None:
    for key, value in recipe.env.items():
        os.environ[key] = value


def _generation_lines(recipe: Recipe) -> list[str]:
    gen = recipe.generation
    if gen.backend is None:
        # from the recipe's values: a dry run checks the training config with vLLM switched off
        defaults = field_index()
        use_vllm = recipe.values.get("use_vllm", defaults["use_vllm"][1].default)
        mode = recipe.values.get("vllm_mode", defaults["vllm_mode"][1].default)
        engine = f"TRL vLLM ({mode})" if use_vllm else "transformers, in the training processes"
        if use_vllm and "vllm_mode" not in recipe.values:  # TRL 0.x recipes (open-r1's) meant a server
            engine += "; TRL 1.x's default mode (TRL 0.18 defaulted to server): set vllm_mode, or generation.backend"
        return [f"generation: {engine}"]
    if gen.backend != "vllm_server":
        return [f"generation: {gen.backend}"]
    from .generation.layout import training_gpus

    where = f"started on GPUs {gen.server_gpus()}" if gen.starts_server() else "already running"
    lines = [f"generation: vLLM server at {gen.url} ({where}), weight sync: {gen.sync_mode(recipe.model.use_peft)}"]
    if gen.starts_server():
        lines.append(f"training GPUs: {training_gpus(gen, recipe.layout.num_processes)}")
    return lines


def render_dry_run(recipe: Recipe, commands: list[str]) -> str:
    """What ``--dry-run`` prints: resolved recipe, layout, batch arithmetic and the commands a run would start."""
    out = [
        f"recipe: {recipe.path}",
        "",
        "resolved values, each with where it came from (every key not listed has its TRL / hf_grpo default):",
    ]
    by_section: dict[str, dict] = {}
    index = field_index()
    for key, value in recipe.values.items():
        by_section.setdefault(index[key][0] if key in index else key, {})[key] = value
    for section in [*SECTIONS, *NESTED]:
        if section in by_section:
            out.append(f"  {section}:")
            for key, value in sorted(by_section[section].items()):
                source = recipe.sources.get(key)
                out.append(f"    {key}: {value!r}" + (f"  # {source}" if source else ""))
    spec = recipe.data.resolved()
    out += [
        "",
        f"model: {recipe.model.model_name_or_path}"
        + (
            f" + LoRA r={recipe.model.lora_r} alpha={recipe.model.lora_alpha} on {recipe.model.lora_target_modules}"
            if recipe.model.use_peft
            else " (full fine-tuning)"
        ),
        (
            f"data: {spec['name']} (task {spec['task']}, "
            f"problem column {spec['prompt_column'] or TRL_COLUMNS['prompt_column'] + ' (TRL default)'!r}, "
            f"gold column {spec['solution_column'] or TRL_COLUMNS['solution_column'] + ' (TRL default)'!r})"
        ),
        f"rewards: {recipe.rewards.reward_funcs} weights {recipe.training.reward_weights or 'all 1.0'}",
        "",
        f"layout: {recipe.layout.describe()}",
        *_generation_lines(recipe),
        "",
        f"batch arithmetic ({recipe.plan.num_processes} training processes):",
        recipe.plan.describe(),
        "",
        "commands:",
        *[f"  {c}" for c in commands],
    ]
    if recipe.miniature is not None:
        out += ["", *recipe.miniature.describe()]
    if recipe.hardware:
        out += ["", "this machine cannot run it as written (a real run exits with code 2):"]
        out += [f"  - {problem}" for problem in recipe.hardware]
    return "\n".join(out)
