"""Every shipped recipe dry-runs without a warning about one of its own keys (the recipes once set
``gradient_checkpointing``, which transformers 5 deprecates for ``activation_checkpointing``).

Warnings are recorded with ``simplefilter("always")`` inside the test, so pyproject's ``filterwarnings`` (which ignores
Future/DeprecationWarning for the whole suite) cannot hide one; log records at WARNING or above count too
(transformers logs some of its deprecations).
"""

from __future__ import annotations

import logging
import re
import warnings

import pytest

from hf_grpo.recipe import NESTED, field_index, nested_index
from hf_grpo.train import main

from .helpers.common import REPO


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
RECIPE_KEYS = [*field_index(), *(name for section in NESTED for name in nested_index(section))]
NAMES_A_KEY = re.compile(
    r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(RECIPE_KEYS, key=len, reverse=True))) + r")\b"
)


class Recorder(logging.Handler):
    """Keeps the message of every log record at WARNING or above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def dry_run_warnings(argv: list[str], capsys) -> list[str]:
    """The warnings and warning log lines of ``python -m hf_grpo.train ARGV --dry-run``, run in this process."""
    recorder = Recorder()
    loggers = [logging.getLogger(name) for name in ("", "transformers", "trl")]  # transformers' does not propagate
    for logger in loggers:
        logger.addHandler(recorder)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            status = main([*argv, "--dry-run"])
    finally:
        for logger in loggers:
            logger.removeHandler(recorder)
    assert status == 0, capsys.readouterr().err
    return [f"{w.category.__name__}: {w.message}" for w in caught] + recorder.messages


def about_recipe_keys(messages: list[str]) -> list[str]:
    return [m for m in messages if NAMES_A_KEY.search(m)]


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.stem for path in RECIPES])
def test_a_shipped_recipe_dry_runs_with_no_warning_about_its_keys(recipe, capsys):
    messages = dry_run_warnings([str(recipe)], capsys)
    print("\n".join(messages))
    assert not about_recipe_keys(messages)


def test_a_deprecated_key_is_caught(tmp_path, capsys):
    """The check sees the warning it exists for: the tiny recipe as it was, with the old name, is reported."""
    old = (REPO / "recipes" / "tiny.yaml").read_text().replace("activation_checkpointing:", "gradient_checkpointing:")
    assert "gradient_checkpointing: false" in old
    (tmp_path / "tiny.yaml").write_text(old)
    messages = dry_run_warnings([str(tmp_path / "tiny.yaml")], capsys)
    assert any("gradient_checkpointing" in m for m in about_recipe_keys(messages)), messages
