"""What of a run may be shown publicly: nothing that names a folder of the training machine. The model card
(``card``) and the Hub push (``hub``) clean every value, recipe and file they show or upload through these.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..recipe import load_yaml


# An absolute path with at least two components (/tmp/run, /home/me/data.jsonl, C:/Users/me/x) or under ~, not inside a
# word, a URL (https://host/a/b) or a longer path. One component (/s, /data) is left alone: too many false positives.
ABS_PATH = re.compile(
    r"(?<![\w.:/~\\-])(?:"
    r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}/?"
    r"|~(?:/[\w.@+-]+)+/?"
    r"|[A-Za-z]:\\(?:[\w.@+-]+\\)*[\w.@+-]+"
    r")"
)
LOCAL_PREFIXES = ("/", "~", "./", "../", ".\\", "..\\")
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")  # a dataset read from a file (hf_grpo.data.loaders)
RECIPE_HEADER = re.compile(r"^(# resolved from )(.+?)( and the command line)", re.MULTILINE)
RECIPE_LINE = re.compile(r"^(\s*(?:- +)?(?:[\w.-]+: +)?)(.*)$", re.DOTALL)  # (indent, item dash, key) and the rest


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path.rstrip("/\\"))[-1] or "<local>"


def is_local_path(value: str) -> bool:
    """Whether ``value`` is a path into this machine: absolute, under ``~`` or relative to ``.``/``..``.

    A plain relative name (``outputs/tiny``, ``Qwen/Qwen2.5-Math-1.5B``) says nothing about the machine and is kept.
    """
    return value.startswith(LOCAL_PREFIXES) or bool(re.match(r"^[A-Za-z]:[\\/]", value))


def scrub_paths(text: str) -> str:
    """``text`` with every absolute path (two components or more, or under ``~``) replaced by its last component."""
    return ABS_PATH.sub(lambda m: _basename(m.group(0)), text)


def public_value(value: Any, *, nested: bool = True) -> Any:
    """``value`` (a recipe or JSON value) with local paths replaced: a string that is one by its file name, paths
    inside other strings by theirs; lists and dicts element by element (only when ``nested``)."""
    if isinstance(value, str):
        if is_local_path(value) and not any(c.isspace() for c in value):
            return _basename(value)
        return scrub_paths(value)
    if nested and isinstance(value, list):
        return [public_value(v) for v in value]
    if nested and isinstance(value, dict):
        return {k: public_value(v) for k, v in value.items()}
    return value


def public_recipe(text: str) -> str:
    """``recipe.yaml`` as it is uploaded and quoted in the card, line by line so that comments stay: a value that is a
    local path becomes its file name (``output_dir: /tmp/run`` -> ``output_dir: run``, list items alike), the header
    ``save_recipe`` writes names the recipe by its file name when it was given as a local path (``# resolved from
    /home/me/r.yaml ...`` -> ``# resolved from r.yaml ...``), and ``scrub_paths`` cleans what is left (comments, paths
    inside longer strings or flow-style lists)."""
    text = RECIPE_HEADER.sub(lambda m: m[1] + (_basename(m[2]) if is_local_path(m[2]) else m[2]) + m[3], text)
    return "".join(_public_recipe_line(line) for line in text.splitlines(keepends=True))


def _public_recipe_line(line: str) -> str:
    prefix, rest = RECIPE_LINE.match(line).groups()
    if rest.strip() and not rest.lstrip().startswith("#"):
        try:
            value = load_yaml(rest)
        except yaml.YAMLError:  # part of a multi-line value: left to scrub_paths
            value = None
        if isinstance(value, str) and is_local_path(value) and not any(c.isspace() for c in value):
            public = yaml.safe_dump(_basename(value)).splitlines()[0]  # quoted where YAML needs it ('123', 'yes')
            raw = next((r for r in (f"'{value}'", f'"{value}"', value) if r in rest), None)
            rest = rest.replace(raw, public, 1) if raw else rest
    return scrub_paths(prefix + rest)
