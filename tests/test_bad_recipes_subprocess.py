"""Bad recipes refused by a fresh interpreter (``python -m hf_grpo.train``): what only a new process shows
(undecodable files, a directory, a real run that must not load the model), each with exit code 2 and one line naming
the problem. The in-process cases: tests/test_bad_recipes.py.
"""

from __future__ import annotations

import time

import pytest

from .helpers.common import REPO, run_module


TINY = str(REPO / "recipes" / "tiny.yaml")

# A fresh interpreter spends most of its time importing torch, transformers and TRL (5-15 s on 2 busy cores), which
# the recipe check needs (its config classes are TRL's). That nothing after the check ran is read from the output: no
# line of the run's first step (RUN_STARTED), and for the real run no output_dir. The time bound only catches a hang:
# CHECK_SECONDS past a bare interpreter that imports the same modules (measured once per module, so both are loaded).
CHECK_SECONDS = 60
RUN_STARTED = "CPU thread(s) per process"  # hf_grpo.run.pipeline.run's first line (before it writes or loads anything)


@pytest.fixture(scope="module")
def import_seconds() -> float:
    start = time.monotonic()
    result = run_module("hf_grpo.recipe.load", timeout=120)  # imports what the check imports, then exits (no __main__)
    assert result.returncode == 0, result.stderr
    return time.monotonic() - start


def assert_refused_by_module(args: list[str], must_mention: str, import_seconds: float) -> None:
    start = time.monotonic()
    result = run_module("hf_grpo.train", *args, timeout=120)
    elapsed = time.monotonic() - start
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert must_mention in lines[0], lines[0]
    assert RUN_STARTED not in result.stderr, result.stderr[-3000:]
    assert elapsed - import_seconds < CHECK_SECONDS, (elapsed, import_seconds)


@pytest.mark.parametrize(
    ("content", "mention"),
    [
        (b"\xff\xfe\x00\x01\x80\x81binary\x00", "UTF-8"),
        ("learning_rate: 1e-3\n".encode("utf-16"), "UTF-8"),
    ],
    ids=["binary", "utf16"],
)
def test_undecodable_recipe_file_subprocess(content, mention, tmp_path, import_seconds):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    assert_refused_by_module([str(path), "--dry-run"], mention, import_seconds)


def test_directory_recipe_subprocess(tmp_path, import_seconds):
    assert_refused_by_module([str(tmp_path), "--dry-run"], "is a directory", import_seconds)


def test_real_run_refuses_before_loading_subprocess(tmp_path, import_seconds):
    # no --dry-run: a real run of a bad recipe exits 2 before any model or dataset loads (the run never starts, no
    # output_dir)
    out = tmp_path / "run"
    assert_refused_by_module([TINY, "--output_dir", str(out), "--temperature", "-1"], "temperature", import_seconds)
    assert not out.exists()
