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
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import HfGRPOConfig, ModelArguments
from .data.loaders import TRL_COLUMNS, DataArguments, is_local_file
from .generation.layout import GenerationArguments, check_generation, trl_fields
from .hardware import MINIATURE_HINT, hardware_problems
from .launch import LaunchArguments, Layout, inside_launch, resolve_layout, shipped_dir
from .miniature import Miniature
from .rewards import RewardArguments, RewardLoadError, resolve_reward, reward_name


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
SECRET_ENV = re.compile(r"(TOKEN|API_KEY|SECRET|PASSWORD)", re.IGNORECASE)


class RecipeLoader(yaml.SafeLoader):
    """YAML 1.2 scalars: only true/false are booleans (``eval_strategy: no`` stays the string "no"), and ``1e-6``
    is a float (PyYAML's YAML 1.1 rules would read it as a string)."""


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


def check_value(key: str, value: Any, hint: Any, f: dataclasses.Field, where: str) -> Any:
    """Type-check and coerce one value; RecipeError names the key, the value and the expected type."""
    if key in SECRET_KEYS and value is not None:
        raise RecipeError(f"{where}: {key} must not be set in a recipe; export HF_TOKEN in the environment instead")
    ok, coerced = _coerce(value, hint)
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
    return coerced


def nested_index(section: str) -> dict[str, tuple[dataclasses.Field, Any]]:
    cls = NESTED[section]
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def check_nested(section: str, key: str, value: Any, where: str) -> Any:
    known = nested_index(section)
    if key not in known:
        raise RecipeError(f"{where}: unknown key {section}.{key}{did_you_mean(key, known)}")
    f, hint = known[key]
    return check_value(f"{section}.{key}", value, hint, f, where)


def did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else "; see `python -m hf_grpo.train --help` for every key"


# ---------------------------------------------------------------------------------------------------------------------
# Command line


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
        else:
            overrides[name] = None  # bare flag
        i += 1
    return path, overrides, flags


def _parse_override(raw: str | None) -> Any:
    if raw is None:
        return True
    try:
        return load_yaml(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


# ---------------------------------------------------------------------------------------------------------------------
# Loading


def default_recipe_path() -> Path:
    return shipped_dir("recipes") / DEFAULT_RECIPE


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist; pass a path such as recipes/tiny.yaml")
    try:
        with open(path) as f:
            data = load_yaml(f)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise RecipeError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping of key: value, got {type(data).__name__}")
    return data


def _check_env(env: Any, where: str) -> dict[str, str]:
    if not isinstance(env, dict):
        raise RecipeError(f"{where}: env must be a mapping of VARIABLE: value")
    for name in env:
        if SECRET_ENV.search(str(name)):
            raise RecipeError(f"{where}: env.{name} looks like a secret; export it in the shell, not in a recipe")
    return {str(k): str(v) for k, v in env.items()}


def _check_files(values: dict, base_dir: Path, where: str, built_later: set[str] = frozenset()) -> None:
    dataset = values.get("dataset_name")
    if isinstance(dataset, str) and is_local_file(dataset) and not Path(dataset).expanduser().is_file():
        raise RecipeError(f"{where}: dataset_name: local file {dataset!r} does not exist")
    model = values.get("model_name_or_path")
    local = isinstance(model, str) and model.startswith(("./", "../", "/", "~"))
    if local and model not in built_later and not Path(model).expanduser().exists():
        raise RecipeError(f"{where}: model_name_or_path: local path {model!r} does not exist")
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
        for key in ("prompt_column", "solution_column"):
            default = TRL_COLUMNS[key]  # a dataset in TRL's format: used when the data has the column
            if spec[key] is None and not (is_local_file(name) and default in _local_columns(name)):
                raise RecipeError(
                    f"{where}: dataset {name!r} has no preset and no {default!r} column, so set {key} (the column name)"
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
    path = Path(path_arg) if path_arg else default_recipe_path()
    where = str(path)
    data = read_yaml(path)
    env = _check_env(data.pop("env", {}) or {}, where)
    index = field_index()

    values: dict[str, Any] = {}
    nested: dict[str, dict] = {section: {} for section in NESTED}
    for key, value in data.items():
        if key in NESTED:
            if not isinstance(value, dict):
                raise RecipeError(f"{where}: {key} must be a mapping of key: value")
            nested[key] = {k: check_nested(key, k, v, where) for k, v in value.items()}
            continue
        if key not in index:
            raise RecipeError(f"{where}: unknown key {key!r}{did_you_mean(key, index)}")
        _, f, hint = index[key]
        values[key] = check_value(key, value, hint, f, where)
    for key, raw in raw_overrides.items():
        section, dot, sub = key.partition(".")
        if dot and section in NESTED:
            parsed = _parse_override(raw)
            f, hint = nested_index(section).get(sub, (None, None))
            if hint is not None and not _coerce(parsed, hint)[0] and raw is not None and _coerce(raw, hint)[0]:
                parsed = raw
            nested[section][sub] = check_nested(section, sub, parsed, f"command line --{key}")
            continue
        if key not in index:
            raise RecipeError(f"command line: unknown option --{key}{did_you_mean(key, index)}")
        _, f, hint = index[key]
        parsed = _parse_override(raw)
        if not _coerce(parsed, hint)[0] and raw is not None and _coerce(raw, hint)[0]:
            parsed = raw  # a string field given something YAML reads as another type, e.g. `--run_name 2024`
        values[key] = check_value(key, parsed, hint, f, f"command line --{key}")

    miniature = None
    if "miniature" in flags:
        from .miniature import miniaturize

        try:
            values, nested["generation"], miniature = miniaturize(values, nested["generation"], set(raw_overrides))
        except ValueError as exc:
            raise RecipeError(f"{where}: --miniature: {exc}") from None
        where = f"{where} (miniature)"
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
    data_args = _build("data", values, where)
    rewards = _build("rewards", values, where)
    _check_data(data_args, where)
    reward_names = [reward_name(n) for n in rewards.reward_funcs]
    metric = values.get("dynamic_sampling_metric", "reward")
    if metric != "reward" and metric not in reward_names:
        raise RecipeError(
            f"{where}: dynamic_sampling_metric {metric!r} is neither 'reward' nor one of the "
            f"reward_funcs {reward_names}"
        )
    if values.get("push_to_hub") and not values.get("hub_model_id"):
        raise RecipeError(
            f"{where}: push_to_hub needs hub_model_id (e.g. your-name/qwen7b-grpo); the token comes "
            "from the HF_TOKEN environment variable"
        )
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
        path, values, model, data_args, rewards, launch, training, layout, plan, generation, env, miniature, hardware
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
    out = [f"recipe: {recipe.path}", "", "resolved values (recipe and overrides; everything else is the default):"]
    by_section: dict[str, dict] = {}
    index = field_index()
    for key, value in recipe.values.items():
        by_section.setdefault(index[key][0] if key in index else key, {})[key] = value
    for section in [*SECTIONS, *NESTED]:
        if section in by_section:
            out.append(f"  {section}:")
            for key, value in sorted(by_section[section].items()):
                out.append(f"    {key}: {value!r}")
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
            f"data: {spec['name']} (task {spec['task']}, problem column {spec['prompt_column']!r}, "
            f"gold column {spec['solution_column']!r})"
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
