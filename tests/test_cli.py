"""The ``hf-grpo`` console command: subcommands, help that names itself, the modules unchanged.

``hf-grpo train|eval|push|report`` call the ``main(argv, prog)`` of ``hf_grpo.train``, ``hf_grpo.evaluate``,
``hf_grpo.publish.hub`` and ``hf_grpo.report``; ``python -m hf_grpo.train`` keeps its own name in its help.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers.common import REPO


pytestmark = pytest.mark.timeout(300)

SUBCOMMANDS = ("train", "eval", "push", "report")
HF_GRPO = Path(sys.executable).with_name("hf-grpo")  # the console script, installed next to this interpreter


def run(argv: list[str]) -> subprocess.CompletedProcess:
    if argv[0] == "hf-grpo":
        assert HF_GRPO.is_file(), f"no {HF_GRPO}: reinstall the package (pip install -e .) to get the console script"
        argv = [str(HF_GRPO), *argv[1:]]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)


def test_help_lists_the_subcommands_without_loading_the_training_stack():
    proc = run(["hf-grpo", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: hf-grpo")
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in proc.stdout, (name, proc.stdout)
    # each subcommand's module is imported only once it is chosen
    code = (
        "import sys\nfrom hf_grpo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules))"
    )
    loaded = run([sys.executable, "-c", code]).stdout.strip().splitlines()[-1]
    assert loaded == "[]"


def test_recipes_ls_lists_them_without_loading_the_training_stack():
    """`hf-grpo recipes ls` took ~19 s: importing hf_grpo.recipe loaded TRL's config classes, and torch with them."""
    code = (
        "import sys\nfrom hf_grpo.cli import main\nmain(['recipes', 'ls'])\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules))"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    *listed, loaded = proc.stdout.strip().splitlines()
    assert loaded == "[]"
    assert any(line.startswith("tiny") for line in listed), listed


@pytest.mark.parametrize("name", ["train", "eval", "push", "report"])
def test_each_subcommand_help_names_itself(name):
    proc = run(["hf-grpo", name, "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: hf-grpo {name} "), proc.stdout[:500]


@pytest.mark.parametrize("module", ["hf_grpo.train", "hf_grpo.evaluate"])
def test_a_module_run_with_python_m_keeps_its_own_name(module):
    proc = run([sys.executable, "-m", module, "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m {module} "), proc.stdout[:500]


def test_train_help_lists_every_recipe_key_by_section(capsys):
    from hf_grpo.recipe import SECTIONS, field_index
    from hf_grpo.train import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for section in SECTIONS:
        assert f"\n{section} keys:\n" in out
    for key in field_index():
        assert f"\n  --{key} " in out, key
    assert "\n  --learning_rate float (default: 1e-06)\n      The initial learning rate" in out
    assert "\n  --generation.backend " in out and "\n  --dry-run " in out and "\n  --miniature " in out


def test_train_dry_run_is_the_same_from_either_entry_point():
    recipe = "recipes/tiny.yaml"
    via_cli = run(["hf-grpo", "train", recipe, "--dry-run"])
    via_module = run([sys.executable, "-m", "hf_grpo.train", recipe, "--dry-run"])
    assert via_cli.returncode == via_module.returncode == 0, via_cli.stderr[-2000:] + via_module.stderr[-2000:]
    assert via_cli.stdout == via_module.stdout
    assert f"recipe: {recipe}" in via_cli.stdout


def test_an_unknown_subcommand_is_one_error_line_naming_the_choices():
    proc = run(["hf-grpo", "fit", "recipes/tiny.yaml"])
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hf-grpo: error:") and "'fit'" in line
    assert all(f"'{name}'" in line for name in SUBCOMMANDS), line
