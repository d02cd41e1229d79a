"""Shipped recipes by name, for a user who installed the wheel and has no recipes/ folder: ``hf-grpo train tiny``
from any folder, ``hf-grpo recipes ls`` and ``hf-grpo recipes cp NAME [DEST]``; the last test builds the wheel,
installs it in a fresh venv and runs them from an empty folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_grpo.cli import main as cli_main
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.recipe.shipped import find, shipped_recipes

from .helpers.common import REPO


SHIPPED = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder with no recipes/ in it, as a pip user's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["tiny", "tiny.yaml", "qwen7b"])
def test_a_shipped_recipe_runs_by_name_from_any_folder(name, elsewhere, capsys):
    assert cli_main(["train", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"recipe: {REPO / 'recipes' / (name.removesuffix('.yaml') + '.yaml')}" in out, out[:500]


def test_a_file_that_exists_wins_over_a_shipped_name(elsewhere):
    (elsewhere / "tiny").write_text("learning_rate: 0.123\n")  # a user's own file called like a shipped recipe
    recipe, _ = load_recipe(["tiny"], for_run=False)
    assert recipe.path == elsewhere / "tiny" or recipe.path.resolve() == (elsewhere / "tiny").resolve()
    assert recipe.training.learning_rate == 0.123


def test_an_unknown_recipe_names_the_shipped_ones(elsewhere):
    with pytest.raises(RecipeError) as caught:
        load_recipe(["tiny2"], for_run=False)
    message = str(caught.value)
    assert "'tiny2' does not exist" in message and "hf-grpo recipes ls" in message
    assert all(name in message for name in SHIPPED), message
    assert find("recipes/tiny") is None and find("../tiny") is None  # a name has no folder in it


def test_ls_lists_every_shipped_recipe_with_its_first_comment_line(capsys):
    assert sorted(shipped_recipes()) == SHIPPED
    assert cli_main(["recipes", "ls"]) == 0
    out = capsys.readouterr().out
    for name in SHIPPED:
        first = (REPO / "recipes" / f"{name}.yaml").read_text().splitlines()[0].lstrip("# ")
        assert any(line.startswith(name) and first[:40] in line for line in out.splitlines()), (name, out)


def test_cp_copies_a_recipe_and_never_overwrites_without_force(elsewhere, capsys):
    assert cli_main(["recipes", "cp", "qwen7b"]) == 0
    copied = elsewhere / "qwen7b.yaml"
    assert copied.read_bytes() == (REPO / "recipes" / "qwen7b.yaml").read_bytes()
    copied.write_text("# mine\n")
    assert cli_main(["recipes", "cp", "qwen7b"]) == 2
    err = capsys.readouterr().err
    assert "qwen7b.yaml exists; pass --force" in err and copied.read_text() == "# mine\n"
    assert cli_main(["recipes", "cp", "qwen7b", "--force"]) == 0
    assert copied.read_bytes() == (REPO / "recipes" / "qwen7b.yaml").read_bytes()
    (elsewhere / "mine").mkdir()
    assert cli_main(["recipes", "cp", "tiny.yaml", "mine"]) == 0 and (elsewhere / "mine" / "tiny.yaml").is_file()
    assert cli_main(["recipes", "cp", "nope"]) == 2
    assert "no shipped recipe is called 'nope'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(900)
def test_from_a_wheel_in_a_fresh_venv_recipes_are_named_listed_and_copied(tmp_path):
    """``pip install .`` (a wheel, not editable) into a fresh venv puts the recipes inside the package: from an empty
    folder, the venv's ``hf-grpo`` command (not this checkout) runs, lists and copies them. The venv borrows this
    environment's dependencies through a ``.pth`` line (installing torch again would take minutes), not hf_grpo."""
    wheels, venv, work = tmp_path / "wheels", tmp_path / "venv", tmp_path / "empty"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)], check=True, timeout=600)
    (wheel,) = wheels.glob("hf_grpo-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True, timeout=300)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    here = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p))
    (Path(site) / "borrowed_dependencies.pth").write_text(here + "\n")  # a path line: its own .pth files are not read
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def hf_grpo(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "hf-grpo"), *argv], cwd=work, env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip

    where = subprocess.run(
        [str(python), "-c", "import hf_grpo; print(hf_grpo.__file__)"], cwd=work, env=env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(site), where.stdout  # the installed copy, not this checkout
    for name in ("tiny", "qwen7b"):
        done = hf_grpo("train", name, "--dry-run")
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"recipe: {Path(site) / 'hf_grpo' / 'recipes' / name}.yaml" in done.stdout, done.stdout[:400]
    listed = hf_grpo("recipes", "ls")
    assert listed.returncode == 0 and all(f"\n{n} " in f"\n{listed.stdout}" for n in SHIPPED), listed.stdout
    copied = hf_grpo("recipes", "cp", "tiny")
    assert copied.returncode == 0, copied.stderr
    assert (work / "tiny.yaml").read_bytes() == (REPO / "recipes" / "tiny.yaml").read_bytes()
