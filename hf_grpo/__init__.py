"""hf_grpo: GRPO for math reasoning on top of TRL.

    from hf_grpo import GRPOTrainer, HfGRPOConfig
    from hf_grpo.train import train   # run a recipe from Python: train("recipes/tiny.yaml", max_steps=30)

The names below are imported on first use, so ``import hf_grpo`` stays cheap (the launcher's watchdog,
``python -m hf_grpo.base.watchdog``, imports this package and must start at once). In ``python -m hf_grpo.train`` this
is the first code of ours to run: it sets up how a stop signal ends the command before torch loads
(``hf_grpo.base.stopping.guard_start``).
"""

from __future__ import annotations

import importlib
import sys

from .base import stopping


if stopping.training_command(sys.orig_argv, sys.argv):
    name_resume_command = stopping.guard_start()  # before anything else loads
    from .base import crash_log  # only here: `python -m hf_grpo.base.crash_log` runs it as its main module

    name_resume_command(crash_log.resume_command)
    del name_resume_command


_EXPORTS = {
    "GRPOTrainer": "hf_grpo.training.trainer",
    "HfGRPOConfig": "hf_grpo.config",
    "load_recipe": "hf_grpo.recipe",
    "RecipeError": "hf_grpo.recipe",
    "load_reward_funcs": "hf_grpo.rewards",
    "RewardArguments": "hf_grpo.rewards",
    "grade": "hf_grpo.rewards",
    "DataArguments": "hf_grpo.data",
    "load_grpo_datasets": "hf_grpo.data",
}

__all__ = [
    "DataArguments",
    "GRPOTrainer",
    "HfGRPOConfig",
    "RecipeError",
    "RewardArguments",
    "grade",
    "load_grpo_datasets",
    "load_recipe",
    "load_reward_funcs",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_grpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
