"""One run result in memory: after a real tiny run, the report, the trackers' story and the model card are written
from what the run holds (``RunResult.from_training``), never from ``eval_results.json``, ``training_history.json`` or
``recipe.yaml`` read back; ``RunResult.load`` rebuilds the same result from those files."""

from __future__ import annotations

import builtins
import io
import re
import shutil
from pathlib import Path

import pytest

from hf_grpo import report as report_command
from hf_grpo.base.run_files import EVAL_FILE, HISTORY_FILE, RECIPE_FILE, SUMMARY_FILE
from hf_grpo.publish.run_result import RunResult
from hf_grpo.run import pipeline
from hf_grpo.train import train


WRITTEN_BACK = (EVAL_FILE, HISTORY_FILE, RECIPE_FILE)  # what the run computes and writes, then must not re-read


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A short tiny run with the before/after evaluation and a tracker, every file opened for reading recorded, and
    the RunResult the pipeline handed to its outputs."""
    out = tmp_path_factory.mktemp("result") / "run"
    opened: list[tuple[Path, str]] = []
    handed: list[RunResult] = []
    real_open, real_write_outputs = builtins.open, pipeline.write_outputs

    def spy_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)):
            opened.append((Path(file).resolve(), mode))
        return real_open(file, mode, *args, **kwargs)

    def spy_write_outputs(run, *args, **kwargs):
        handed.append(run)
        return real_write_outputs(run, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(builtins, "open", spy_open)
        patch.setattr(io, "open", spy_open)  # what pathlib's read_text / open call
        patch.setattr(pipeline, "write_outputs", spy_write_outputs)
        patch.setenv("TENSORBOARD_LOGGING_DIR", str(out.parent / "tb"))
        train(
            "recipes/tiny.yaml",
            output_dir=str(out),
            max_steps=2,
            warm_start_steps=10,
            tiny_hidden_size=64,
            arithmetic_eval_size=8,
            arithmetic_train_size=64,
            per_device_train_batch_size=16,
            logging_steps=1,
            report_to=["tensorboard"],
        )
    (run,) = handed
    return out, run, opened


def test_outputs_never_read_back_what_the_run_computed(tiny_run):
    out, run, opened = tiny_run
    read = [(path.name, mode) for path, mode in opened if path.parent == out.resolve() and "r" in mode]
    assert not [name for name, _ in read if name in WRITTEN_BACK], read
    written = {path.name for path, mode in opened if "w" in mode}  # through a temporary file (run_files.replacing)
    assert {re.sub(r"^\.(.+)\.\d+\.tmp(.*)$", r"\1\2", name) for name in written} >= {SUMMARY_FILE, "README.md"}
    card = (out / "README.md").read_text()
    assert "## Held-out accuracy" in card and "| accuracy difference, paired |" in card
    assert run.has_eval and run.gain is not None and run.history and run.recipe_text


def test_load_rebuilds_the_result_the_run_held(tiny_run):
    out, run, _ = tiny_run
    loaded = RunResult.load(out)
    assert loaded.output_dir == run.output_dir
    assert loaded.values == run.values and loaded.recipe_text == run.recipe_text and loaded.defaults == run.defaults
    assert loaded.history == run.history and loaded.evaluations == run.evaluations and loaded.gain == run.gain
    assert loaded.versions == run.versions and loaded.versions_recorded and run.versions_recorded
    assert loaded.adapter_config == run.adapter_config and loaded.samples == run.samples
    assert loaded == run


def test_report_command_rebuilds_the_outputs(tiny_run, tmp_path, capsys):
    out = tmp_path / "run"  # a copy: the run's folder is shared with the tests above
    shutil.copytree(tiny_run[0], out, ignore=shutil.ignore_patterns("base_model", "runs"))
    written = {name: (out / name).read_text() for name in (SUMMARY_FILE, "README.md")}
    for name in written:
        (out / name).unlink()
    assert report_command.main([str(out)]) == 0
    assert {name: (out / name).read_text() for name in written} == written
    assert report_command.main([str(out / "missing")]) == 2
    (out / RECIPE_FILE).write_text("a: [unclosed\n")
    assert report_command.main([str(out)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
