"""The package's import graph, read with the standard library's ``ast``: every module sits in one of the layers README
draws ("Layers"), every import of ours points to the same or a lower layer, there is no cycle, and an import inside a
function (kept only where it saves start-up time) says so in a comment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


PACKAGE = Path(__file__).resolve().parent.parent / "hf_grpo"

# Bottom to top, as in README's layout section: the folders (and the modules at the root). A name covers the module
# and, for a package, everything in it.
LAYERS = [
    ["config", "base"],
    ["data", "rewards", "generation", "evaluation", "models", "vllm_standin"],
    ["training", "launch"],
    ["miniature"],
    ["recipe"],
    ["publish"],
    ["monitoring"],
    ["run"],
    ["train", "evaluate", "report", "cli", ""],
]


def modules() -> dict[str, Path]:
    """Every importable module of the package (a directory without ``__init__.py``, such as the stand-in's fake
    ``vllm`` tree, is not part of it), by dotted name relative to ``hf_grpo`` ("" is the package itself)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if any(not (PACKAGE.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def layer_of(name: str) -> int:
    best, best_len = None, -1
    for index, names in enumerate(LAYERS):
        for prefix in names:
            covers = name == prefix or (prefix and name.startswith(prefix + ".")) or (prefix == "" and name == "")
            if covers and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"hf_grpo.{name} is in no layer: add it to LAYERS here and to README's layout drawing")
    return best


def _target(module: str, is_package: bool, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """The package modules an import statement loads (with the packages they live in)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if module else []
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            stem = ".".join(base + ([node.module] if node.module else []))
            names = [stem] + [f"{stem}.{a.name}" if stem else a.name for a in node.names]
            names = ["hf_grpo." + n if n else "hf_grpo" for n in names]
        else:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    targets = set()
    for name in names:
        if name != "hf_grpo" and not name.startswith("hf_grpo."):
            continue
        short = name.removeprefix("hf_grpo").removeprefix(".")
        if short in known:
            targets.add(short)
    # importing a.b.c runs the packages a and a.b first
    for short in list(targets):
        parts = short.split(".")
        targets.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in known)
    return sorted(targets)


def import_graph():
    known = modules()
    edges, lazy = {}, []
    for name, path in known.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inside = {id(n) for f in functions for n in ast.walk(f)}
        own_packages = {".".join(name.split(".")[:i]) for i in range(name.count(".") + 1)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = [t for t in _target(name, path.name == "__init__.py", node, set(known)) if t != name]
            targets = [t for t in targets if t not in own_packages]  # a module's own package is already loading
            if not targets:
                continue
            edges.setdefault(name, set()).update(targets)
            if id(node) in inside:
                text = lines[node.lineno - 1] + (lines[node.lineno - 2] if node.lineno > 1 else "")
                lazy.append((name, node.lineno, "#" in text))
    return known, edges, lazy


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_down_the_layers():
    _, edges, _ = import_graph()
    upward = [
        f"hf_grpo.{a or '__init__'} (layer {layer_of(a)}) imports hf_grpo.{b} (layer {layer_of(b)})"
        for a, targets in sorted(edges.items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a) and a != ""
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycle():
    _, edges, _ = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(f"hf_grpo.{m}" for m in cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)


def test_a_lazy_import_of_ours_says_why():
    _, _, lazy = import_graph()
    silent = [f"hf_grpo.{name} line {line}" for name, line, commented in lazy if not commented and name != ""]
    assert not silent, "imports inside functions without a comment saying what they save:\n" + "\n".join(silent)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a two-module package that imports itself in a circle, from a lower layer."""
    pkg = tmp_path / "hf_grpo"
    (pkg / "base").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "base" / "__init__.py").write_text("")
    (pkg / "base" / "run_files.py").write_text("from ..train import main\n")
    (pkg / "train.py").write_text("def main():\n    from .base import run_files\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg, raising=False)
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    _, edges, lazy = import_graph()
    assert edges == {"base.run_files": {"train"}, "train": {"base", "base.run_files"}}
    assert lazy == [("train", 2, False)]
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_the_import_graph_has_no_cycle()
    with pytest.raises(AssertionError, match="hf_grpo.base.run_files .layer 0. imports hf_grpo.train"):
        test_imports_point_down_the_layers()


def test_no_module_over_500_lines_and_no_function_over_80():
    """The shape the guide asks for, kept: a file that grows past 500 lines or a function past 80 is split."""
    too_long = []
    for name, path in modules().items():
        source = path.read_text()
        if len(source.splitlines()) > 500:
            too_long.append(f"hf_grpo.{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                too_long.append(f"hf_grpo.{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "\n".join(too_long)
