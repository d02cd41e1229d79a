"""The YAML dialect of recipes: YAML 1.2 scalars, merge keys, no duplicate keys and no alias bombs (``load_yaml``),
and reading a recipe file (``read_yaml``) with a ``RecipeError`` for every way it can be unreadable."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml

from .schema import RecipeError
from .shipped import names_hint
from .values import shown


MERGE = "tag:yaml.org,2002:merge"
# A recipe holds tens of values; aliases can make a few lines stand for billions ("billion laughs").
MAX_VALUES = 100_000


class _Recursive(Exception):
    """A node that contains itself through an alias."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes ``node`` stands for once its aliases are expanded (at most ``MAX_VALUES + 1``)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise _Recursive
    open_nodes.add(id(node))
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    size = 1
    for child in children:
        size = min(size + _expanded_size(child, sizes, open_nodes), MAX_VALUES + 1)
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size


def _check_expansion(root: yaml.Node) -> None:
    """Refuse an alias bomb or a value that contains itself, naming the top-level key that holds it."""
    pairs = root.value if isinstance(root, yaml.MappingNode) else [(None, root)]
    sizes, total = {}, 0
    for key_node, value_node in pairs:
        name = f"{key_node.value[:80]}: " if isinstance(key_node, yaml.ScalarNode) else ""
        try:
            total += _expanded_size(value_node, sizes, set())
        except _Recursive:
            problem = f"{name}the value contains itself through an alias; write it out without the alias"
            raise yaml.constructor.ConstructorError(None, None, problem, value_node.start_mark) from None
        if total > MAX_VALUES:
            problem = (
                f"{name}its aliases expand to more than {MAX_VALUES} values (an alias bomb); a recipe is a few "
                "dozen values: write them out"
            )
            raise yaml.constructor.ConstructorError(None, None, problem, value_node.start_mark)


class RecipeLoader(yaml.SafeLoader):
    """YAML 1.2 scalars: only true/false are booleans (``eval_strategy: no`` stays the string "no"), and ``1e-6``
    is a float (PyYAML's YAML 1.1 rules would read it as a string). A key given twice in one mapping is an error
    (PyYAML keeps the last one silently); merge keys (``<<: *base``) are read as ``yaml.safe_load`` reads them, the
    mapping's own keys winning. A document that aliases expand past ``MAX_VALUES`` values is refused."""

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)

    def _check_duplicates(self, node: yaml.MappingNode) -> None:
        seen = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE:  # the merged mappings' own keys, before flatten_mapping mixes them in
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for mapping in merged:
                    if isinstance(mapping, yaml.MappingNode):
                        self._check_duplicates(mapping)
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)} (also on line {seen[key]}); keep one", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._check_duplicates(node)
            self.flatten_mapping(node)
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
    try:
        return yaml.load(text_or_stream, Loader=RecipeLoader)
    except RecursionError:
        raise yaml.YAMLError("values nested too deeply (hundreds of levels); a recipe value is a few levels") from None


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise RecipeError(
            f"recipe path {shown(str(path))} is a directory; pass a recipe file such as {path}/tiny.yaml"
        )
    if not path.is_file():
        raise RecipeError(f"recipe file {shown(str(path))} does not exist; pass a path to one, or {names_hint()}")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); a recipe is YAML text saved as UTF-8"
        ) from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot be read: {exc.strerror}") from None


ODD_SPACES = "\u00a0\u2007\u202f"  # no-break spaces: pasted from a web page, they look like spaces but are not
SPACE_AFTER_INDICATOR = re.compile(f"[:-]([{ODD_SPACES}])")  # where YAML needs a plain space


def _space_name(char: str) -> str:
    return {"\t": "a tab", "\u00a0": "a no-break space (U+00A0)"}.get(char, f"U+{ord(char):04X}")


def _check_indentation(path: Path, text: str) -> None:
    """YAML indents with spaces only: a no-break space or a tab there (pasted from a web page or an editor) makes
    the parser point at the next line, or read the line as part of a value; name the line and the character."""
    for number, line in enumerate(text.splitlines(), start=1):
        indent = line[: len(line) - len(line.lstrip(" \t" + ODD_SPACES))]
        odd = next((c for c in indent if c not in " \t"), None)
        if odd is None and line.startswith("\t"):  # a tab after spaces may be a block scalar's text
            odd = "\t"
        if odd is not None and line.strip() and not line.lstrip().startswith("#"):
            raise RecipeError(
                f"{path}: line {number} is indented with {_space_name(odd)}; YAML indents with plain spaces only: "
                f"replace it with spaces ({shown(line.strip()[:60])})"
            )


def _odd_space_before(text: str, last_line: int) -> tuple[int, str, str] | None:
    """(line number, character, line) of the first no-break space after a ``:`` or ``-`` on lines 1 to
    ``last_line``, where the parser failed: there it glues ``key:`` and the value into one scalar, and the parser
    gives up a line later. (In a quoted value it is text, and a later error is not its.)"""
    for number, line in enumerate(text.splitlines()[:last_line], start=1):
        found = SPACE_AFTER_INDICATOR.search(line)
        if found is not None and not line.lstrip().startswith("#"):
            return number, found.group(1), line
    return None


def read_yaml(path: Path) -> dict:
    """The mapping of a recipe file; RecipeError when it is missing, not UTF-8, invalid YAML, empty or not a mapping."""
    text = _read_text(path)
    _check_indentation(path, text)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        odd = _odd_space_before(text, mark.line + 1) if mark else None
        if odd is not None:
            number, char, line = odd
            raise RecipeError(
                f"{path}: invalid YAML: line {number} holds {_space_name(char)} where YAML needs a plain space; "
                f"replace it with a space ({shown(line.strip()[:60])})"
            ) from None
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
            raise RecipeError(
                f"{path}: key {shown(key)} is not a name; recipe keys are field names such as learning_rate"
            )
    return data
