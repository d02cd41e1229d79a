"""The YAML dialect of recipes: YAML 1.2 scalars and no duplicate keys (``load_yaml``), and reading a recipe file
(``read_yaml``) with a ``RecipeError`` for every way it can be unreadable."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml

from .schema import RecipeError


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
    """The mapping of a recipe file; RecipeError when it is missing, not UTF-8, invalid YAML, empty or not a mapping."""
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
