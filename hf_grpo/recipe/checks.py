"""The checks that span several keys of a recipe: its env section, the files it names, its data and rewards, LoRA
keys, logging/saving intervals, the number of optimizer steps, the generation section and the weights' precision.
Each raises ``RecipeError`` naming the key, the value and a fix."""

from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ..base.run_files import RunFileError, output_dir_problem
from ..config import ModelArguments
from ..data.files import LOCAL_BUILDERS, cut_last_line
from ..data.loaders import TRL_COLUMNS, DataArguments, is_local_file, source_splits
from ..data.word_problems import HELD_OUT_KINDS, HELD_OUT_SPACE
from ..evaluation.checks import check_weights
from ..generation.cycle import overlap_cycle
from ..generation.settings import GenerationArguments, check_generation
from ..launch.processes import Layout
from ..models import registry as local_models
from ..rewards import RewardArguments, RewardLoadError, resolve_reward, reward_name
from ..rewards.grading import TASKS
from .plan import check_rows
from .schema import BatchPlan, RecipeError, default_of
from .values import clipped, shown


# Whole segments of a variable name (HF_TOKEN, WANDB_API_KEY), so that TOKENIZERS_PARALLELISM is not a secret.
SECRET_ENV = re.compile(r"(?:^|_)(TOKENS?|KEYS?|APIKEY|SECRETS?|PASSWORDS?|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# File suffixes that name a data file the ``datasets`` builders of hf_grpo do not read (a hub id has none of them).
UNREADABLE_DATA_SUFFIXES = (".txt", ".tsv", ".xlsx", ".xls", ".arrow", ".yaml", ".yml", ".xml", ".zip", ".gz", ".tar")
# Correctness rewards that fix how gold answers are graded, for a dataset with no preset and no ``task``: TRL's
# accuracy rewards parse the gold with math-verify as MATH does.
TASK_OF_REWARD = {
    "math_correctness": "math",
    "r1_zero_correctness": "math",
    "accuracy_reward": "math",
    "reasoning_accuracy_reward": "math",
    "gsm8k_correctness": "gsm8k",
    "hash_correctness": "gsm8k",
}
LORA_KEYS = (
    "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save",
    "lora_task_type", "use_rslora", "use_dora",
)  # fmt: skip
INTERVALS = {"save_steps": "save_strategy", "logging_steps": "logging_strategy", "eval_steps": "eval_strategy"}
HALF_DTYPES = ("bfloat16", "float16")


def check_env(env: Any) -> dict[str, str]:
    """The recipe's ``env`` section as strings: variable names only, no secrets, scalar values."""
    if not isinstance(env, dict):
        raise RecipeError("env must be a mapping of VARIABLE: value")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise RecipeError(f"env.{name} is not an environment variable name (letters, digits and _)")
        if SECRET_ENV.search(name):
            raise RecipeError(f"env.{name} looks like a secret; export it in the shell, not in a recipe")
        if isinstance(value, (dict, list)) or value is None:
            raise RecipeError(f"env.{name} must be a string, number or boolean, got {shown(value)}")
    return {k: str(v) for k, v in env.items()}


def _check_dataset_file(key: str, name: Any) -> None:
    if not isinstance(name, str):
        return
    if is_local_file(name):
        if not Path(name).expanduser().is_file():
            raise RecipeError(f"{key}: local file {shown(name)} does not exist")
        return
    suffix = os.path.splitext(name)[1].lower()
    if suffix in UNREADABLE_DATA_SUFFIXES or (suffix and Path(name).expanduser().is_file()):
        raise RecipeError(
            f"{key}: {shown(name)} is a {suffix or 'local'} file, which cannot be read as a dataset; convert it "
            f"to one of {sorted(LOCAL_BUILDERS)} (one problem per row, with a problem and a gold answer column)"
        )


def _check_output_dir(output_dir: Any) -> None:
    """``output_dir`` (or the nearest of its parents that exists) must be a directory: mkdir fails after loading.
    It must not be a filesystem root, the home folder or a folder of the user's (``run_files.output_dir_problem``):
    a run writes its adapter, ``base_model/``, ``README.md`` and ``summary.md`` there."""
    if not isinstance(output_dir, str):
        return
    path = Path(output_dir).expanduser()
    try:
        problem = output_dir_problem(path)
    except RunFileError as exc:  # a damaged manifest there, or in a folder above
        raise RecipeError(f"output_dir {shown(output_dir)}: {exc}") from None
    if problem is not None:
        raise RecipeError(
            f"output_dir {shown(output_dir)} {problem}: a run writes its adapter, README.md and summary.md there; "
            "choose a new or empty folder such as outputs/run (or a run's own output_dir, to resume it)"
        )
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "is an existing file" if existing == path else f"is under {shown(str(existing))}, which is a file"
        raise RecipeError(f"output_dir {shown(output_dir)} {what}; choose a directory path such as outputs/run")
    if existing is not None and not _writable(existing):
        where_not = "" if existing == path else f" (nearest existing folder: {shown(str(existing))})"
        raise RecipeError(
            f"output_dir {shown(output_dir)} cannot be written{where_not}; choose a directory you can write, "
            "such as outputs/run"
        )


def _writable(directory: Path) -> bool:
    """Whether a folder can be made in ``directory``: its mode, then a probe folder made and removed at once (root
    passes every mode check, but not /proc, /sys or a read-only mount)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hf_grpo-write-check-", dir=directory))
    except OSError:
        return False
    return True


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "adapter_model.*")


def _check_model(model: Any, built_later: set[str]) -> None:
    """A local model folder (a packaged model's once ``hf-grpo model get`` made it) holds a config and whole weights,
    read from their headers (``evaluation.checks.check_weights``); an empty folder, an unfinished copy or a damaged
    file otherwise fails only when ``from_pretrained`` runs, with a traceback. A packaged model not made yet, or a hub
    id offline and not cached, is for ``checks_env.check_hardware``: a dry run may be for another machine."""
    if not isinstance(model, str) or model in built_later or model == "tiny":  # tiny: built in code, no folder
        return
    folder = Path(local_models.resolve(model) or model).expanduser()
    if model.startswith(("./", "../", "/", "~")) and not folder.exists():
        raise RecipeError(f"model_name_or_path: local path {shown(model)} does not exist")
    if not folder.is_dir():
        return
    packaged = local_models.resolve(model) is not None  # whole when its files have its manifest's sizes
    if packaged and (problem := local_models.folder_problem(model)) is not None:
        raise RecipeError(f"model_name_or_path: {problem}")
    if not packaged and not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise RecipeError(
            f"model_name_or_path: folder {shown(str(folder))} has no config.json (an empty folder or an "
            "unfinished download?); point it at a folder written by save_pretrained"
        )
    if not packaged and not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise RecipeError(
            f"model_name_or_path: folder {shown(str(folder))} has a config.json but no weights "
            "(model.safetensors, model-*.safetensors or pytorch_model*.bin); copy them there or fix the path"
        )
    try:
        check_weights(folder)
    except ValueError as exc:
        raise RecipeError(f"model_name_or_path: {exc}") from None


def check_files(values: dict, built_later: set[str] = frozenset()) -> None:
    """Every file, directory and reward the recipe names exists (``built_later``: a model a miniature builds)."""
    for key in ("dataset_name", "eval_dataset_name"):
        _check_dataset_file(key, values.get(key))
    _check_model(values.get("model_name_or_path"), built_later)
    _check_output_dir(values.get("output_dir"))
    deepspeed = values.get("deepspeed")
    if isinstance(deepspeed, str) and not Path(deepspeed).expanduser().is_file():
        raise RecipeError(f"deepspeed: config file {shown(deepspeed)} does not exist")
    resume = values.get("resume_from_checkpoint")
    if isinstance(resume, str) and resume.lower() not in ("true", "auto") and not Path(resume).expanduser().exists():
        raise RecipeError(f"resume_from_checkpoint: {shown(resume)} does not exist")
    for name in values.get("reward_funcs") or []:
        try:
            resolve_reward(name)
        except RewardLoadError as exc:
            raise RecipeError(clipped(exc)) from None
    kwargs = values.get("reward_kwargs") or {}
    unknown = set(kwargs) - set(values.get("reward_funcs") or RewardArguments().reward_funcs)
    if unknown:
        raise RecipeError(f"reward_kwargs names {sorted(unknown)}, which are not in reward_funcs")


def infer_task(data: DataArguments, reward_funcs: list[str]) -> str | None:
    """The task a recipe without one implies: the one its correctness rewards agree on (None when unset or unclear)."""
    if data.resolved()["task"] is not None:
        return None
    tasks = {TASK_OF_REWARD.get(reward_name(n)) for n in reward_funcs} - {None}
    return tasks.pop() if len(tasks) == 1 else None


def check_data(data: DataArguments) -> None:
    """The grader and the columns of the dataset are known before anything loads."""
    if data.dataset_streaming:
        raise RecipeError("dataset_streaming is not supported; use max_train_samples to bound a large dataset")
    for name in filter(None, (data.dataset_name, data.eval_dataset_name)):
        spec = data.resolved(None if name == data.dataset_name else name)
        if spec["task"] not in TASKS:
            raise RecipeError(
                f"dataset {shown(name)} needs task: one of {list(TASKS)} (how gold answers are graded); "
                f"got {spec['task']!r}"
            )
        if not is_local_file(name):
            continue  # a hub dataset's columns are checked when it loads, before the model (hf_grpo.train.run)
        if name.lower().endswith(".jsonl"):
            _check_last_line(name)
        columns = _local_columns(name)
        for key in ("prompt_column", "solution_column"):
            default = TRL_COLUMNS[key]  # a dataset in TRL's format: used when the data has the column
            if spec[key] is None and default not in columns:
                raise RecipeError(
                    f"dataset {shown(name)} has no {default!r} column (TRL's name), so set {key} to the column "
                    f"that holds it{f'; columns: {sorted(columns)}' if columns else ''}"
                )


def _check_last_line(path: str) -> None:
    """A JSON Lines file whose last line does not parse (a copy or a download that stopped) is refused here, before
    a launcher starts a server or a model loads; any other bad line is named when the data loads
    (``hf_grpo.data.files.load_file``), still before the model."""
    try:
        problem = cut_last_line(str(Path(path).expanduser()))
    except OSError:
        return  # unreadable: the load says why
    if problem is not None:
        raise RecipeError(f"dataset file {shown(path)} holds a bad {problem}")


def _local_columns(path: str) -> set[str]:
    """The columns of a local JSON Lines / JSON / CSV file, from its first record (empty when unknown)."""
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            if path.endswith(".csv"):
                return set(next(csv.reader(f), []))
            record = json.loads(f.readline().strip()) if path.endswith(".jsonl") else None
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    return set(record) if isinstance(record, dict) else set()


def check_sampling_metric(values: dict, rewards: RewardArguments) -> None:
    """``dynamic_sampling_metric`` is ``reward`` or names one of the rewards."""
    reward_names = [reward_name(n) for n in rewards.reward_funcs]
    metric = values.get("dynamic_sampling_metric", "reward")
    if metric != "reward" and metric not in reward_names:
        raise RecipeError(
            f"dynamic_sampling_metric {shown(metric)} is neither 'reward' nor one of the reward_funcs {reward_names}"
        )


def check_reward_weights(values: dict, rewards: RewardArguments) -> None:
    """``reward_weights`` has one weight per reward."""
    weights = values.get("reward_weights")
    if weights is not None and len(weights) != len(rewards.reward_funcs):
        raise RecipeError(
            f"reward_weights has {len(weights)} entries but reward_funcs has "
            f"{len(rewards.reward_funcs)}; give one weight per reward"
        )


def check_lora_keys(values: dict, in_file: set[str], on_command_line: set[str]) -> None:
    """LoRA keys do nothing without use_peft: true. ``--use_peft false`` on the command line turns a LoRA recipe into
    full fine-tuning, so only LoRA keys from the same place as (or a later place than) use_peft: false are refused."""
    if values.get("use_peft", False):
        return
    ignored = on_command_line if "use_peft" in on_command_line else in_file | on_command_line
    lora = [key for key in LORA_KEYS if key in ignored]
    if lora:
        state = "use_peft: false" if "use_peft" in values else "use_peft is false (the default)"
        raise RecipeError(
            f"{lora[0]} is set but {state}, so the LoRA settings {lora} would be ignored; set use_peft: true "
            "to train a LoRA adapter, or remove them for full fine-tuning"
        )


def check_trl_refusals(values: dict, model: ModelArguments, uses_vllm: bool) -> None:
    """The combinations ``trl.GRPOTrainer.__init__`` refuses that the recipe alone decides, refused here before the
    model loads, each naming its keys and fix (``tests/test_trl_refusals.py`` pins every refusal of TRL's against
    this list or a reason it cannot come from a recipe)."""
    sync, beta = values.get("sync_ref_model", False), values.get("beta", default_of("beta"))
    targets = model.lora_target_modules
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    liger = values.get("liger_kernel_config") or {}
    vespo_mode = values.get("vllm_importance_sampling_mode", "sequence_mask") in ("token_truncate", "token_mask")
    refusals = {
        "sync_ref_model: true with beta 0: there is no reference model to sync; set sync_ref_model: false, or a "
        "beta above 0": sync and beta == 0,
        "sync_ref_model: true with use_peft: true: with LoRA the reference is the adapter switched off, which TRL "
        "cannot sync (NotImplementedError); set sync_ref_model: false": sync and model.use_peft,
        "lora_target_modules with lm_head, whose adapter TRL never trains (it reads lm_head.weight directly); "
        "remove lm_head from lora_target_modules": model.use_peft and "lm_head" in targets,
        "liger_kernel_config fused_linear_cross_entropy: true, which replaces the forward TRL patches with its "
        "fused LM head; remove it": isinstance(liger, dict) and bool(liger.get("fused_linear_cross_entropy")),
        "loss_type: vespo with vLLM unless vllm_importance_sampling_mode is token_truncate or token_mask; set "
        "one of them": values.get("loss_type") == "vespo"
        and uses_vllm
        and not vespo_mode
        and values.get("vllm_importance_sampling_correction", True),
    }
    for why, refused in refusals.items():
        if refused:
            raise RecipeError(f"TRL's GRPOTrainer refuses {why}")


def check_warm_start_keys(values: dict, model: ModelArguments) -> None:
    """``warm_start_reference`` does something only with a KL term, LoRA and a pretrained policy's warm start;
    ``warm_start_max_lines`` only with a pretrained policy's warm start (the tiny model's builds its base instead)."""
    if model.warm_start_max_lines is not None and not model.warm_starts_pretrained:
        has = "warm_start_steps: 0" if model.warm_start_steps == 0 else "the tiny model"
        raise RecipeError(
            f"warm_start_max_lines: {model.warm_start_max_lines} keeps a pretrained policy's warm start to short gold "
            f"solutions, and this recipe has {has}: remove the key, or set warm_start_steps above 0 with a pretrained "
            "model_name_or_path"
        )
    beta = values.get("beta", default_of("beta"))
    if model.warm_start_reference and not (model.use_peft and model.warm_starts_pretrained and beta > 0):
        raise RecipeError(
            f"warm_start_reference: true makes the KL term's reference the warm-started adapter, and this recipe has "
            f"{'no KL term (beta 0)' if beta == 0 else 'no LoRA adapter' if not model.use_peft else 'no warm start'}"
            ": remove the key, or set beta above 0, use_peft: true and warm_start_steps above 0 (a pretrained model)"
        )


def check_intervals(values: dict) -> None:
    """A ``*_strategy: steps`` needs a positive interval (``0`` makes transformers divide by zero mid-run)."""
    for key, strategy_key in INTERVALS.items():
        strategy = values.get(strategy_key, default_of(strategy_key))
        value = values.get(key, default_of(key))
        if str(getattr(strategy, "value", strategy)) == "steps" and value is not None and value <= 0:
            raise RecipeError(
                f"{key} must be > 0 with {strategy_key}: steps, got {shown(value)}; set {key} to a number of "
                f"steps (or a fraction of the run below 1), or set {strategy_key}: 'no'"
            )


def check_steps(values: dict, plan: BatchPlan, data: DataArguments) -> None:
    """A run that would make no optimizer step (it would exit 0 having trained nothing) is an error."""
    max_steps = values.get("max_steps", default_of("max_steps"))
    epochs = values.get("num_train_epochs", default_of("num_train_epochs"))
    if max_steps == 0 or (max_steps < 0 and epochs <= 0):
        raise RecipeError(
            f"max_steps {max_steps} with num_train_epochs {epochs} makes 0 optimizer steps; set max_steps "
            "to a positive number of steps, or num_train_epochs > 0"
        )
    # at most how many training rows there are, and which key says so, when the recipe alone tells
    bounds = [(data.max_train_samples, "max_train_samples")] if data.max_train_samples is not None else []
    if data.resolved()["name"] in GENERATED:
        bounds.append((data.arithmetic_train_size, "arithmetic_train_size"))
    rows, key = min(bounds, default=(None, None))
    if rows is not None:  # the rows as loaded are checked again when the data loads (hf_grpo.run.pipeline)
        check_rows(plan, rows, f"the training data has at most {rows} rows ({key})")


GENERATED = ("arithmetic", "word_problems")  # embedded training sets drawn in code, arithmetic_train_size rows
BYTES_PER_PROBLEM = 1500  # peak memory per generated problem while it loads (measured: 1.4 kB, 300k word problems)
ONLY_FOR = {  # data keys read by one embedded dataset only: set for another, they would be silently ignored
    "word_problems_max_steps": ("word_problems",),
    "word_problems_named_lines": ("word_problems",),
    "word_problems_compare": ("word_problems",),
    "arithmetic_two_step_share": ("arithmetic",),
}


def check_data_sizes(values: dict, data: DataArguments) -> None:
    """Embedded data sizes against the machine (what generating them takes fits in half its free memory), and the
    keys one embedded dataset reads set for another; before anything loads."""
    sources = [data.dataset_name, data.eval_dataset_name]
    for key, readers in ONLY_FOR.items():
        if key in values and not any(name in readers for name in sources):
            raise RecipeError(
                f"{key} is read only with dataset_name: {readers[0]}, and this recipe trains on "
                f"{data.dataset_name!r}: remove {key}, or set dataset_name: {readers[0]}"
            )
    if "word_problems_held_out" in sources:  # each kind has room for so many distinct problems
        most = len(HELD_OUT_KINDS) * min(HELD_OUT_SPACE.values())
        if data.arithmetic_eval_size > most:
            raise RecipeError(
                f"arithmetic_eval_size {data.arithmetic_eval_size} asks word_problems_held_out for more distinct "
                f"problems than it has: set arithmetic_eval_size to at most {most}"
            )
    free = available_memory()
    for key in ("arithmetic_train_size", "arithmetic_eval_size"):
        size = getattr(data, key)
        if free is None or key not in values or size * BYTES_PER_PROBLEM <= free / 2:
            continue
        most = int(free / 2 / BYTES_PER_PROBLEM)
        raise RecipeError(
            f"{key} {size} would take about {size * BYTES_PER_PROBLEM / 1e9:.0f} GB to generate, and this machine "
            f"has {free / 1e9:.0f} GB free: set {key} to at most {most} (a run reads only the prompts of its steps)"
        )


def available_memory() -> int | None:
    """Bytes of memory the machine has free for a new process (``MemAvailable``), None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_held_out(values: dict, data: DataArguments) -> None:
    """What stands on held-out evaluations during training (``keep_top_k``, ``stop_on: [plateau]``) needs a held-out
    split: without one it would silently do nothing. (A periodic evaluation alone is a warning when the data loads.)"""
    wants = ["keep_top_k"] if values.get("keep_top_k") else []
    wants += ["stop_on: [plateau]"] if "plateau" in (values.get("stop_on") or []) else []
    if not wants or "eval" in source_splits(data) or data.eval_split_size > 0:
        return
    raise RecipeError(
        f"{wants[0]} reads held-out evaluations during training, and {data.dataset_name!r} gives no held-out split: "
        "set eval_dataset_name (a preset or a file) or eval_split_size (a share of the training rows, such as 0.05)"
    )


def check_generation_section(generation: GenerationArguments, model: ModelArguments, values: dict) -> None:
    """The generation section fits the model (LoRA rank, adapters vLLM can load) and the training keys."""
    problems = check_generation(generation, model.use_peft, model.lora_r, set(values))
    if generation.backend == "vllm_server" and generation.sync_mode(model.use_peft) == "lora":
        # what vLLM's adapter loader refuses (hf_grpo.vllm_standin.lora.unsupported_lora_features): caught here,
        # not at the first weight sync after the model has loaded
        if model.use_dora:
            problems.append("use_dora: true: vLLM cannot hot-load DoRA adapters; set use_dora: false")
        if model.lora_modules_to_save:
            problems.append(
                f"lora_modules_to_save: {model.lora_modules_to_save}: vLLM loads adapters only with "
                "modules_to_save None; remove it, or use generation.weight_sync: full"
            )
    if generation.starts_server() and model.model_name_or_path == "tiny":
        problems.append(
            "model_name_or_path: tiny is built inside the training process, and a vLLM server started for it has no "
            "folder to load; use generation.backend: transformers, or add --miniature (it saves a tiny model the "
            "server can load)"
        )
    if generation.overlap and values.get("vllm_importance_sampling_correction", True) is False:
        problems.append(
            "generation.overlap trains on batches an older policy generated, which TRL's vLLM importance-sampling "
            "correction reweights; remove vllm_importance_sampling_correction: false"
        )
    if problems:
        raise RecipeError("; ".join(problems))


def check_overlap_cycle(generation: GenerationArguments, plan: BatchPlan, num_iterations: int) -> None:
    """With ``generation.overlap``, generations start optimizer steps and the staleness bound covers one cycle
    (``hf_grpo.generation.cycle``; the trainer checks the same for API users, after the model has loaded)."""
    if generation.overlap:
        steps, ga = plan.steps_per_generation, plan.gradient_accumulation_steps
        _, problems = overlap_cycle(generation.max_staleness, steps, num_iterations, ga)
        if problems:
            raise RecipeError(problems[0])


def check_precision(model: ModelArguments, layout: Layout) -> None:
    """Full fine-tuning of half-precision weights needs fp32 master weights, which only DeepSpeed keeps (why: see
    docs/recipes.md, "Precision"); PEFT creates LoRA adapters in fp32, so a LoRA recipe may load a bf16 base."""
    if model.use_peft or model.dtype not in HALF_DTYPES or layout.distributed_type == "DEEPSPEED":
        return
    raise RecipeError(
        f"dtype: {model.dtype} with use_peft: false trains {model.dtype} weights without fp32 master weights (only "
        "DeepSpeed keeps them), so updates smaller than the weights' rounding step are lost; set dtype: float32 and "
        "keep bf16: true (mixed precision: bf16 compute, fp32 weights and optimizer), or use a DeepSpeed "
        "accelerate_config"
    )


def check_warm_start(model: ModelArguments, layout: Layout) -> None:
    """A pretrained model's warm start trains the loaded weights before the trainer shards them, which ZeRO-3 and
    FSDP do as the model loads or is wrapped."""
    if model.warm_starts_pretrained and (layout.zero_stage == 3 or layout.distributed_type == "FSDP"):
        raise RecipeError(
            f"warm_start_steps: {model.warm_start_steps} trains a pretrained model before GRPO, on weights that "
            f"{'ZeRO-3' if layout.zero_stage == 3 else 'FSDP'} shards across processes; use the ddp or zero2 "
            "accelerate_config for a warm-started run, or set warm_start_steps: 0"
        )
