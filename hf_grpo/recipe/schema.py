"""What a recipe is: its sections (the argument dataclasses whose fields are its keys), the index of every key, and
the validated result (``Recipe``, ``BatchPlan``, ``RecipeError``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import HfGRPOConfig, ModelArguments
from ..data.loaders import DataArguments
from ..generation.settings import GenerationArguments
from ..launch.processes import LaunchArguments, Layout
from ..miniature import Miniature
from ..rewards import RewardArguments


SECTIONS = {
    "model": ModelArguments,
    "data": DataArguments,
    "rewards": RewardArguments,
    "launch": LaunchArguments,
    "training": HfGRPOConfig,
}
NESTED = {"generation": GenerationArguments}  # sections written as a YAML mapping (``generation: {backend: ...}``)


class RecipeError(Exception):
    """A problem with a recipe or its overrides; the message says which key, which value and how to fix it."""


@contextlib.contextmanager
def located(where: str) -> Iterator[None]:
    """Say where (the recipe file, a command-line option) in front of a ``RecipeError`` raised inside: the checks
    raise without a location, and the one that runs them (``load_recipe``, ``apply_overrides``) adds it once."""
    try:
        yield
    except RecipeError as exc:
        raise RecipeError(f"{where}: {exc}") from None


@functools.cache
def field_index() -> dict[str, tuple[str, dataclasses.Field, Any]]:
    """Every recipe key: name -> (section, dataclass field, resolved type hint); one dict, read-only."""
    index = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                index[f.name] = (section, f, hints[f.name])
    return index


def nested_index(section: str) -> dict[str, tuple[dataclasses.Field, Any]]:
    """Every key of a nested section: name -> (dataclass field, resolved type hint)."""
    hints = typing.get_type_hints(NESTED[section])
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(NESTED[section])}


def key_defaults() -> dict[str, Any]:
    """The default of every recipe key (None for a key whose default is built by a factory)."""
    return {k: None if f.default is dataclasses.MISSING else f.default for k, (_, f, _) in field_index().items()}


def default_of(key: str) -> Any:
    return field_index()[key][1].default


def section_values(values: dict, section: str) -> dict:
    """The explicit values that belong to one section."""
    index = field_index()
    return {k: v for k, v in values.items() if k in index and index[k][0] == section}


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
        ratio = p.steps_per_generation / p.gradient_accumulation_steps
        return "\n".join([generation, step, f"  {ratio:g} optimizer step(s) per generation"])


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
    miniature: Miniature = field(default_factory=Miniature)  # what --miniature swapped; else the identity
    hardware: list[str] = field(default_factory=list)  # what this machine cannot run (reported by --dry-run)
    sources: dict[str, str] = field(default_factory=dict)  # where each value in ``values`` came from (--dry-run)
