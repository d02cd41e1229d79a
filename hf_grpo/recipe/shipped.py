"""The recipes shipped with hf_grpo, by name, for a user who installed the wheel and has no ``recipes/`` folder.

    hf-grpo recipes ls                    # each shipped recipe with the first line of its comment
    hf-grpo recipes cp qwen7b my.yaml     # a copy to edit (refuses to overwrite without --force)
    hf-grpo recipes cp tiny configs/      # into a folder, created when DEST ends in /
    hf-grpo train qwen7b --dry-run        # a shipped recipe by name, wherever the command runs

A wheel carries the recipes inside the package (``hf_grpo/recipes``); a source checkout has them next to it
(``process_layout.shipped_dir``). A name is a recipe's file name with or without ``.yaml``; a path that exists
always wins over a name.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from ..base.run_files import replacing
from ..launch.processes import shipped_dir


def shipped_recipes() -> dict[str, Path]:
    """Every shipped recipe by name (``tiny`` -> .../recipes/tiny.yaml), sorted by name."""
    return {path.stem: path for path in sorted(shipped_dir("recipes").glob("*.yaml"))}


def find(name: str) -> Path | None:
    """The shipped recipe ``name`` (``tiny`` or ``tiny.yaml``) names, or None: a name has no folder in it."""
    if not name or Path(name).name != name:
        return None
    return shipped_recipes().get(name.removesuffix(".yaml"))


def names_hint() -> str:
    """The shipped names, for an error about a recipe that was not found."""
    return f"a shipped recipe's name ({', '.join(shipped_recipes())}; `hf-grpo recipes ls`)"


def summary(path: Path) -> str:
    """The first comment line of a recipe (what it trains, on what), marked when its sentence goes on."""
    lines = path.read_text(encoding="utf-8").splitlines()
    first = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    return first if not first or first.endswith(".") else f"{first} ..."


def copy(name: str, dest: str | None, force: bool) -> Path:
    """Copy the shipped recipe ``name`` to ``dest`` (default ``./NAME.yaml``; a folder gets ``NAME.yaml`` inside, and
    ``DIR/`` that does not exist yet is created). The copy goes to a temporary file beside the target, renamed over it
    once whole: a full disk leaves the file ``--force`` would have replaced as it was."""
    source = find(name)
    if source is None:
        raise ValueError(f"no shipped recipe is called {name!r}; pass {names_hint()}")
    target = Path(dest) if dest else Path(source.name)
    if dest and dest.endswith(("/", os.sep)):  # a folder, by its trailing slash
        target.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        target = target / source.name
    if target.exists() and not force:
        raise ValueError(f"{target} exists; pass --force to overwrite it, or another destination")
    if not target.parent.is_dir():
        raise ValueError(f"folder {target.parent} does not exist; create it first (a DEST ending in / is created)")
    try:
        with replacing(target) as tmp:
            shutil.copyfile(source, tmp)
    except OSError as exc:
        kept = "it is left as it was" if target.exists() else "nothing was written"
        raise ValueError(f"could not write {target} ({exc.strerror or exc}); {kept}") from None
    return target


def main(argv: list[str] | None = None, prog: str = "hf-grpo recipes") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="List the shipped recipes, or copy one to edit.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("ls", help="each shipped recipe with what it trains")
    cp = actions.add_parser("cp", help="copy a shipped recipe to edit: cp NAME [DEST] (default ./NAME.yaml)")
    cp.add_argument("name", help="a shipped recipe's name, e.g. tiny or qwen7b")
    cp.add_argument("dest", nargs="?", help="file or folder to write (default: NAME.yaml here)")
    cp.add_argument("--force", action="store_true", help="overwrite DEST when it exists")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.action == "ls":
        recipes = shipped_recipes()
        width = max(len(name) for name in recipes)
        for name, path in recipes.items():
            print(f"{name:<{width}}  {summary(path)}")  # noqa: T201
        print(f"\n(in {shipped_dir('recipes')}; run one with `hf-grpo train NAME`, copy one with `{prog} cp NAME`)")  # noqa: T201
        return 0
    try:
        target = copy(args.name, args.dest, args.force)
    except (ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    print(f"wrote {target}; run it with `hf-grpo train {target}`")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
