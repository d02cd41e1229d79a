"""A disk that fills up during a run ends it with one line naming what could not be written, the resume command and
no traceback, and the last complete checkpoint stays one a run can resume from. Real full filesystems: a small tmpfs
(mounting one needs root; the tests skip without it), and ``/dev/full``, which answers every write with ENOSPC."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from hf_grpo.base.run_files import claim
from hf_grpo.train import main
from hf_grpo.training.checkpoints import problem

from .helpers.common import REPO


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs mounted at ``tmp_path/disk``, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()}); the full-disk test needs one")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]


# checkpoint-2 of the run below writes PEFT's README (5 KiB), then the adapter (safetensors, ~180 KiB), its config,
# then the optimizer state (torch.save, ~380 KiB): the space left decides which write runs out first. Each writer's
# case names the file written just before it and the space left.
# (PEFT's README.md was the first file of a checkpoint: hf_grpo's trainer no longer lets PEFT write one)
RUNS_OUT_IN = {"safetensors": (None, 64 << 10), "torch.save": ("adapter_model.safetensors", 320 << 10)}


@pytest.mark.parametrize("writer", RUNS_OUT_IN)
def test_a_disk_filling_up_during_a_checkpoint_ends_with_one_line_and_keeps_the_last_one(small_disk, capsys, writer):
    """The disk fills up after checkpoint-1 (a reward fills it once that checkpoint is complete); checkpoint-2's
    writes then fail inside safetensors or torch.save, which raise SafetensorError and RuntimeError, not OSError:
    that ended in a traceback. Now one line, exit 1, and checkpoint-1 is still complete."""
    out, (written_before, leave) = small_disk / "run", RUNS_OUT_IN[writer]
    filling = "tests.helpers.reward_plugins:fills_the_disk_after_checkpoint_1"
    argv = [
        str(REPO / "recipes" / "tiny.yaml"), "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1",
        "--logging_steps", "10", "--output_dir", str(out), "--report_to", "none", "--eval_before_after", "false",
        "--task_eval_steps", "0", "--warm_start_steps", "0", "--arithmetic_train_size", "64",
        "--arithmetic_eval_size", "8", "--per_device_train_batch_size", "16", "--num_generations", "4",
        "--dynamic_sampling", "false", "--max_completion_length", "8",
        "--reward_funcs", f"[gsm8k_correctness, {filling}]",
        "--reward_kwargs", json.dumps({filling: {"run": str(out), "leave": leave}}),
    ]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "No space left on device writing" in lines[0] and str(out) in lines[0], lines[0]
    assert lines[0].endswith("--resume_from_checkpoint auto"), lines[0]
    assert (small_disk / "filler").is_file(), "the disk was never filled: the test did not test"
    assert problem(out / "checkpoint-1") is None, "the last complete checkpoint must stay usable"
    assert not (out / "checkpoint-2" / "hf_grpo_checkpoint.json").exists()
    written = sorted(p.name for p in (out / "checkpoint-2").iterdir())
    assert written_before in written if written_before else not written, written  # where it ran out
    assert "trainer_state.json" not in written, written


def test_a_full_disk_ends_the_run_with_one_line_naming_the_file_and_leaves_no_temp_file(tmp_path, capsys):
    """A full disk while the history was written (``on_log``) ended in a traceback and left a ``.tmp``. The history's
    temp file is made a link to ``/dev/full``."""
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("/dev/full is not the kernel's full device on this machine")
    out = claim(tmp_path / "run")  # a run of ours (a folder holding a file is one only with its manifest)
    (out / "training_history.json.tmp").symlink_to("/dev/full")
    argv = [str(REPO / "recipes" / "tiny.yaml"), "--max_steps", "1", "--output_dir", str(out), "--report_to", "none"]
    code = main(argv + ["--eval_before_after", "false", "--task_eval_steps", "0"])
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert f"No space left on device writing {out / 'training_history.json'}" in lines[0], lines[0]
    assert "--resume_from_checkpoint auto" in lines[0], lines[0]
    assert not (out / "training_history.json.tmp").exists()
