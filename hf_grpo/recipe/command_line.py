"""The command line of a run: ``[recipe.yaml] [--config X] [--key value ...] [--dry-run]`` split into the recipe
path, overrides and flags (``split_argv``), and the overrides checked into the recipe's values (``apply_overrides``)."""

from __future__ import annotations

import typing
from typing import Any

import yaml

from .schema import NESTED, RecipeError, field_index, located, nested_index
from .values import check_nested, check_value, coerce, shown
from .yaml12 import load_yaml


FLAGS = {"dry_run", "help", "miniature"}


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
            elif arg.startswith("-") and len(arg) > 1:  # a flag is never a path
                raise RecipeError(f"unknown option {shown(arg)}; options look like --key value (see --help)")
            elif path is None:
                path = arg
            else:
                raise RecipeError(f"unexpected argument {shown(arg)}; options look like --key value")
            i += 1
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name in FLAGS:
            flags.add(name)
        elif name == "config":
            if not eq:
                value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
            if not value or value.startswith("-"):  # `--config --dry-run`: a flag is never a path
                raise RecipeError(
                    f"--config needs a recipe file, got {shown(value) if value else 'nothing'}; write --config "
                    "recipes/tiny.yaml (or the recipe path alone)"
                )
            path = value
        elif eq:
            overrides[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            items, i = [argv[i + 1]], i + 1
            while _takes_list(name) and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                if path is None and argv[i + 1].endswith((".yaml", ".yml")):
                    break  # the recipe after a list option: `--lora_target_modules q_proj v_proj recipe.yaml`
                items, i = [*items, argv[i + 1]], i + 1  # `--reward_funcs a b`, as TRL's --help shows lists
            overrides[name] = items[0] if len(items) == 1 else "[" + ", ".join(items) + "]"
        else:
            overrides[name] = None  # bare flag
        i += 1
    return path, overrides, flags


def _override_value(key: str, raw: str | None, hint: Any) -> Any:
    """A command-line value read as YAML; a malformed ``[list]`` or ``{mapping}`` for a field that takes one is an
    error (read as a plain string, ``'[q_proj,'`` would become a module name)."""
    if raw is None:
        return True
    try:
        parsed = load_yaml(raw) if raw.strip() else raw
    except yaml.YAMLError as exc:
        takes_collection = hint is not None and (coerce([], hint)[0] or coerce({}, hint)[0])
        if takes_collection and raw.lstrip().startswith(("[", "{")):
            raise RecipeError(
                f"{shown(raw)} is not a valid YAML list or mapping ({getattr(exc, 'problem', exc)}); "
                f"write it as --{key} '[a, b]'"
            ) from None
        return raw
    if hint is not None and not coerce(parsed, hint)[0] and coerce(raw, hint)[0]:
        return raw  # a string field given something YAML reads as another type, e.g. `--run_name 2024`
    return parsed


def apply_overrides(raw_overrides: dict[str, str | None], values: dict, nested: dict[str, dict]) -> None:
    """Check each command-line override and set it in ``values`` (``nested`` for ``--generation.key``)."""
    index = field_index()
    for key, raw in raw_overrides.items():
        section, dot, sub = key.partition(".")
        with located(f"command line --{key}"):
            if dot and section in NESTED:
                _, hint = nested_index(section).get(sub, (None, None))
                nested[section][sub] = check_nested(section, sub, _override_value(key, raw, hint))
            else:
                _, f, hint = index[key]
                values[key] = check_value(key, _override_value(key, raw, hint), hint, f)
