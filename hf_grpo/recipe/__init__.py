"""Recipes: one flat YAML file per run, checked completely before any model is loaded.

    python -m hf_grpo.train recipes/qwen7b.yaml --learning_rate 2e-6 --num_generations 8
    python -m hf_grpo.train --config recipes/qwen7b.yaml --lora_target_modules '[q_proj,v_proj]' --dry-run

A recipe's keys are the fields of the argument dataclasses plus ``env``; overrides use the same names. Anything a
user can get wrong fails with ``RecipeError`` (key, value and a fix), exit code 2 in ``hf_grpo.train``. Keys,
overrides and the modules step by step: docs/recipes.md.
"""

from .command_line import split_argv
from .dry_run import render_dry_run
from .load import DEFAULT_RECIPE, apply_env, default_recipe_path, load_recipe, miniaturize
from .plan import batch_plan
from .schema import NESTED, SECTIONS, BatchPlan, Recipe, RecipeError, field_index, nested_index, section_values
from .yaml12 import RecipeLoader, load_yaml, read_yaml


__all__ = [
    "DEFAULT_RECIPE", "NESTED", "SECTIONS", "BatchPlan", "Recipe", "RecipeError", "RecipeLoader", "apply_env",
    "batch_plan", "default_recipe_path", "field_index", "load_recipe", "load_yaml", "miniaturize", "nested_index",
    "read_yaml", "render_dry_run", "section_values", "split_argv",
]  # fmt: skip
