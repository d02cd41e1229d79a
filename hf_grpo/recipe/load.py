"""``load_recipe``: a command line to a validated ``Recipe``, as a list of named steps (read the file, check each
value, apply the overrides, swap in the miniature, build the argument dataclasses, check them together)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .. import miniature as miniatures
from ..config import HfGRPOConfig, ModelArguments
from ..data.loaders import DataArguments
from ..generation.settings import GenerationArguments, trl_fields
from ..launch.hardware import auto_backend
from ..launch.launcher import inside_launch
from ..launch.processes import (
    LaunchArguments,
    Layout,
    loopback_host_problem,
    main_address_problem,
    main_port_problem,
    resolve_layout,
    shipped_dir,
    unnamed_node_message,
)
from ..miniature import Miniature
from ..models import registry as local_models
from ..rewards import RewardArguments
from . import checks, checks_env, memory, schema, shipped
from .command_line import apply_overrides, split_argv
from .plan import batch_plan
from .schema import NESTED, SECTIONS, BatchPlan, Recipe, RecipeError, field_index, key_defaults, section_values
from .values import check_known_keys, check_nested, check_value, clipped
from .yaml12 import read_yaml


DEFAULT_RECIPE = "tiny.yaml"


def load_recipe(argv: list[str], for_run: bool = True) -> tuple[Recipe, set[str]]:
    """Parse ``argv`` into a validated Recipe and the flags given (``dry_run``, ``help``).

    ``for_run=False`` (dry runs) builds the training config with hardware-bound settings neutralised, so a GPU
    recipe can be checked on a laptop; the batch arithmetic always uses the recipe's own process layout.
    """
    path_arg, overrides, flags = split_argv(argv)
    path, from_file = _recipe_path(path_arg, overrides)
    data = read_yaml(path)
    with schema.located(str(path)):
        env = checks.check_env(data.pop("env", {}) or {})
    values, nested = _checked_values(data, overrides, str(path))
    sources = _sources(values, nested, overrides, from_file)
    nested["generation"], chosen = auto_backend(nested["generation"])  # before a miniature reads the section
    if chosen is not None:
        sources["generation.backend"] = chosen
    where = (
        f"{path} (with {' '.join(f'--{key}' for key in overrides)} from the command line)" if overrides else str(path)
    )
    with schema.located(where):
        _check_keys_together(values, set(data), set(overrides), sources)
        values, miniature = _miniature(values, nested, flags, set(overrides), sources)
    with schema.located(miniature.located(where)):
        built_later = miniature.built_later
        checks.check_files(values, built_later)
        launch = _build("launch", values)
        layout = _layout(launch, path.parent, miniature, for_run)
        plan = batch_plan(values, layout.num_processes)
        model = _build_model(values)
        data_args, rewards = _build("data", values), _build("rewards", values)
        _check_built(values, env, miniature.env, plan, model, data_args, rewards, built_later)
        generation = GenerationArguments(**nested["generation"])
        checks.check_generation_section(generation, model, values)
        checks.check_trl_refusals(values, model, uses_vllm=generation.backend in ("vllm_colocate", "vllm_server"))
        if generation.overlap and "vllm_importance_sampling_mode" not in values:  # why: hf_grpo/generation/overlap.py
            values["vllm_importance_sampling_mode"] = "token_truncate"
            sources["vllm_importance_sampling_mode"] = "generation.overlap's default (per-token truncated weights)"
        checks_env.check_sizes(model, values, generation, env, built_later)
        checks.check_precision(model, layout)
        checks.check_warm_start(model, layout)
        hardware = checks_env.check_hardware(values, layout, generation, miniature.active, for_run, env)
        training = _training_config(values, plan, generation, model.use_peft, layout, for_run)
        checks.check_overlap_cycle(generation, plan, training.num_iterations)
    if nested["generation"]:
        values["generation"] = nested["generation"]
    recipe = Recipe(path, values, model, data_args, rewards, launch, training, layout, plan, generation, env)
    recipe.hardware, recipe.sources = hardware, sources
    recipe.miniature, recipe.env = miniature, {**miniature.env, **env}
    if for_run:
        with schema.located(where):
            memory.check_memory(recipe)  # the plan's verdict, before anything is built or loaded
        miniature.build()
    return recipe, flags


def default_recipe_path() -> Path:
    return shipped_dir("recipes") / DEFAULT_RECIPE


def _recipe_path(path_arg: str | None, overrides: dict) -> tuple[Path, str]:
    """(recipe file, how ``--dry-run`` names where its values came from); the embedded tiny recipe without one."""
    model_override = overrides.get("model_name_or_path")
    if not path_arg and model_override not in (None, "tiny"):
        raise RecipeError(
            f"--model_name_or_path {model_override} without a recipe would take the embedded tiny recipe's learning "
            "rate, lengths, batch and LoRA: start from a recipe in recipes/ (e.g. `python -m hf_grpo.train "
            f"recipes/qwen7b.yaml --model_name_or_path {model_override}`) or write your own"
        )
    if path_arg:
        named = shipped.find(path_arg) if not Path(path_arg).exists() else None  # a path that exists wins
        return (named, str(named)) if named is not None else (Path(path_arg), str(Path(path_arg)))
    return default_recipe_path(), f"tiny default ({DEFAULT_RECIPE}, no recipe given)"


def _checked_values(data: dict, overrides: dict, path: str) -> tuple[dict[str, Any], dict[str, dict]]:
    """(flat values, nested sections) of the file and the command line, each key known and each value checked; an
    error names the recipe file (``path``) or the command line."""
    index = field_index()
    values: dict[str, Any] = {}
    nested: dict[str, dict] = {section: {} for section in NESTED}
    with schema.located(path):
        check_known_keys([k for k in data if k not in NESTED], index)
    with schema.located("command line"):
        check_known_keys([k for k in overrides if k.partition(".")[0] not in NESTED], index, options=True)
    with schema.located(path):
        for key, value in data.items():
            if key in NESTED:
                if not isinstance(value, dict):
                    raise RecipeError(f"{key} must be a mapping of key: value")
                nested[key] = {k: check_nested(key, k, v) for k, v in value.items()}
                continue
            _, f, hint = index[key]
            values[key] = check_value(key, value, hint, f)
    apply_overrides(overrides, values, nested)
    return values, nested


def _sources(values: dict, nested: dict, overrides: dict, from_file: str) -> dict[str, str]:
    """Where each value came from: the recipe file or the command line."""
    sources = {key: "command line" if key in overrides else from_file for key in values}
    sources.update({key: from_file for key in NESTED if nested[key]})
    sources.update({key: "command line" for key in overrides if key.partition(".")[0] in NESTED})
    return sources


def _check_keys_together(values: dict, in_file: set, on_command_line: set, sources: dict) -> None:
    """The checks that span several values, then the task the rewards imply (before a miniature mirrors the data in
    the task's answer format)."""
    checks.check_lora_keys(values, in_file, on_command_line)
    checks.check_intervals(values)
    checks_env.check_report_to(values)
    reward_funcs = _build("rewards", values).reward_funcs
    inferred = checks.infer_task(_build("data", values), reward_funcs)
    if inferred is not None:
        values["task"] = inferred
        sources["task"] = f"inferred from reward_funcs ({', '.join(reward_funcs)})"


def miniaturize(values: dict, generation: dict, fixed: set[str]) -> tuple[dict, dict, Miniature]:
    """``hf_grpo.miniature.miniaturize`` given what it reads of the recipe: every key's default, the data section
    and the reward names."""
    data = DataArguments(**section_values(values, "data"))
    reward_funcs = section_values(values, "rewards").get("reward_funcs") or RewardArguments().reward_funcs
    return miniatures.miniaturize(values, generation, fixed, key_defaults(), data, reward_funcs)


def _miniature(values: dict, nested: dict, flags: set, fixed: set, sources: dict) -> tuple[dict, Miniature]:
    """The recipe's values and their miniature with ``--miniature`` (new values and generation section, and what was
    swapped); otherwise the values as they are and the identity ``Miniature()``."""
    if "miniature" not in flags:
        return values, Miniature()
    try:
        values, nested["generation"], miniature = miniaturize(values, nested["generation"], fixed)
    except ValueError as exc:
        raise RecipeError(f"--miniature: {clipped(exc)}") from None
    sources.update({swap.key: "--miniature" for swap in miniature.swaps})
    return values, miniature


def _build(section: str, values: dict):
    cls, kwargs = SECTIONS[section], section_values(values, section)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise RecipeError(clipped(exc)) from None


def _build_model(values: dict) -> ModelArguments:
    model = _build("model", values)
    folder = local_models.resolve(model.model_name_or_path)
    if folder is not None:  # a model from the package index (hf-grpo model get): its folder is what loads
        model.model_name_or_path = folder
    targets = values.get("lora_target_modules")
    if isinstance(targets, list):  # trl.ModelConfig makes ["q_proj"] the regex "q_proj", which PEFT matches against
        # full names only; PEFT's "all-linear" works only as a string
        model.lora_target_modules = "all-linear" if targets == ["all-linear"] else list(targets)
    return model


def _layout(launch: LaunchArguments, base_dir: Path, miniature: Miniature, for_run: bool) -> Layout:
    """The process layout (accelerate config), with a miniature's CPU mixed precision; with several machines, a run
    must say which node this is (a miniature simulates them all on this host)."""
    try:
        layout = resolve_layout(launch, base_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise RecipeError(clipped(exc)) from None
    rank, machines = layout.machine_rank, layout.num_machines
    if machines > 1 and rank is not None and not 0 <= rank < machines:
        raise RecipeError(f"machine_rank is {rank}, but num_machines is {machines}: use 0 to {machines - 1}")
    if layout.num_processes % machines:  # accelerate would start num_processes // num_machines on each, silently
        raise RecipeError(
            f"num_processes {layout.num_processes} does not divide among num_machines {machines}: every machine runs "
            f"the same number of training processes; use a multiple of {machines}"
        )
    if for_run and machines > 1 and not miniature.active and not inside_launch() and not layout.names_node():
        raise RecipeError(unnamed_node_message(machines))
    if machines > 1 and layout.main_process_ip and not inside_launch():  # before launching: the rendezvous
        source = "main_process_ip" if launch.main_process_ip else "$MASTER_ADDR"  # would retry it for minutes
        if problem := main_address_problem(layout.main_process_ip, source, resolve=for_run):
            raise RecipeError(problem)
        if for_run and rank == 0 and (problem := main_port_problem(layout.main_port)):
            raise RecipeError(problem)
    if for_run and (problem := loopback_host_problem(layout, gloo=not torch.cuda.is_available())):
        raise RecipeError(problem)  # before any process group waits on an address no peer reaches
    layout.mixed_precision = miniature.mixed_precision or layout.mixed_precision
    return layout


def _check_built(values, env, miniature_env, plan, model, data_args, rewards, built_later) -> None:
    """The checks that need the built sections: data, offline datasets, steps, LoRA targets, rewards, push."""
    checks.check_data(data_args)
    checks.check_data_sizes(values, data_args)
    checks.check_held_out(values, data_args)
    checks_env.check_offline(data_args, {**miniature_env, **env})
    checks.check_steps(values, plan, data_args)
    checks_env.check_lora_targets(model, values, built_later)
    checks.check_warm_start_keys(values, model)
    checks.check_sampling_metric(values, rewards)
    if values.get("push_to_hub"):
        checks_env.check_push(values, env)
    checks.check_reward_weights(values, rewards)


def _training_config(values, plan: BatchPlan, generation, use_peft: bool, layout, for_run: bool) -> HfGRPOConfig:
    """The training config. It trains only in the process that runs it: a dry run, or the launcher of several
    processes (whose world size is not the run's), checks it with the planned batch and hardware-bound settings
    neutralised."""
    trains_here = for_run and (inside_launch() or layout.num_processes == 1)
    training_values = section_values(values, "training") if trains_here else _validation_training_values(values, plan)
    generated = trl_fields(generation, use_peft)
    training_values.update(generated if trains_here else {k: v for k, v in generated.items() if k != "use_vllm"})
    try:
        return HfGRPOConfig(**training_values)
    except (ValueError, TypeError) as exc:
        raise RecipeError(clipped(exc)) from None


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


def apply_env(recipe: Recipe) -> None:
    """Export the recipe's ``env`` section (and a miniature's variables) into this process."""
    for key, value in recipe.env.items():
        os.environ[key] = value
