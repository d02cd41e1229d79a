"""The names a notebook needs come from the package itself, and importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import trl

import hf_grpo


def test_the_public_names_import_from_the_package():
    from hf_grpo import GRPOTrainer, HfGRPOConfig, RecipeError, grade, load_recipe
    from hf_grpo.train import train

    assert issubclass(GRPOTrainer, trl.GRPOTrainer) and issubclass(HfGRPOConfig, trl.GRPOConfig)
    assert callable(train) and callable(load_recipe) and issubclass(RecipeError, Exception)
    assert grade("#### 4", "#### 4", "gsm8k") == "correct"
    assert set(hf_grpo.__all__) <= set(dir(hf_grpo))


def test_an_unknown_name_is_an_attribute_error():
    try:
        hf_grpo.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("hf_grpo.NoSuchThing did not raise")


def test_importing_the_package_loads_no_training_stack():
    """The launcher's watchdog runs ``python -m hf_grpo.base.watchdog``: the package import must not pull in torch."""
    code = "import sys, hf_grpo; print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_train_is_a_function_of_the_train_module():
    """`hf_grpo.train` is the command-line module (no module-replacing trick); its `train` function runs a recipe."""
    import hf_grpo.train as module
    from hf_grpo.train import train

    assert callable(train) and not callable(module) and module.train is train
    assert module.train.__doc__.startswith("Run a recipe from Python")


def test_the_console_commands_are_installed():
    """`hf-grpo` (train|eval|push|report) and its older alias `hf-grpo-train` (pip install -e . after a change)."""
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("hf-grpo")}
    assert scripts == {"hf-grpo": "hf_grpo.cli:main", "hf-grpo-train": "hf_grpo.train:main"}
