"""Recipes: one flat YAML file per run, checked completely before any model is loaded.

    python -m hf_grpo.train recipes/qwen7b.yaml --learning_rate 2e-6 --num_generations 8
    python -m hf_grpo.train --config recipes/qwen7b.yaml --lora_target_modules '[q_proj,v_proj]' --dry-run

A recipe's keys are the fields of the argument dataclasses plus ``env``; overrides use the same names. Anything a
user can get wrong fails with ``RecipeError`` (key, value and a fix), exit code 2 in ``hf_grpo.train``. Keys,
overrides and the modules step by step: docs/recipes.md.
"""

from __future__ import annotations

import importlib


# Each name below is imported from its module on first use: `hf-grpo recipes ls` (hf_grpo.recipe.shipped) must not
# wait ~15 s for torch and TRL, which the schema (``schema``, ``load``) imports.
_EXPORTS = {
    "split_argv": "command_line",
    "render_dry_run": "dry_run",
    "DEFAULT_RECIPE": "load", "apply_env": "load", "default_recipe_path": "load", "load_recipe": "load",
    "miniaturize": "load",
    "batch_plan": "plan",
    "NESTED": "schema", "SECTIONS": "schema", "BatchPlan": "schema", "Recipe": "schema", "RecipeError": "schema",
    "field_index": "schema", "nested_index": "schema", "section_values": "schema",
    "RecipeLoader": "yaml12", "load_yaml": "yaml12", "read_yaml": "yaml12",
}  # fmt: skip
__all__ = [
    "DEFAULT_RECIPE", "NESTED", "SECTIONS", "BatchPlan", "Recipe", "RecipeError", "RecipeLoader", "apply_env",
    "batch_plan", "default_recipe_path", "field_index", "load_recipe", "load_yaml", "miniaturize", "nested_index",
    "read_yaml", "render_dry_run", "section_values", "split_argv",
]  # fmt: skip


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_grpo.recipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
