"""One run per ``output_dir`` (its lock), a resume with a recipe whose shapes changed is refused before
anything loads, and a finished run resumed says so and trains nothing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hf_grpo.base import run_lock
from hf_grpo.base.run_files import (
    CHECKPOINT_MANIFEST,
    EVAL_FILE,
    EVAL_RECORDS,
    HISTORY_FILE,
    LOCK_FILE,
    PLOT_FILE,
    RECIPE_FILE,
    SUMMARY_FILE,
)
from hf_grpo.publish.card import CARD_FILE, CARD_MARKER
from hf_grpo.train import main as train_main

from .helpers.common import REPO, run_module
from .helpers.launching import wait_until


pytestmark = pytest.mark.subprocess

QUICK = [
    "--warm_start_steps", "0", "--arithmetic_train_size", "64", "--arithmetic_eval_size", "8",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "8",
    "--task_eval_steps", "0", "--logging_steps", "1",
]  # fmt: skip
OUTPUTS = (EVAL_FILE, SUMMARY_FILE, PLOT_FILE, CARD_FILE)  # what a run writes after training


def errors_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hf_grpo: error:")]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-step run of the tiny recipe (lora_r 16) that saved checkpoint-1 and checkpoint-2."""
    out = tmp_path_factory.mktemp("guard") / "run"
    result = run_module(
        "hf_grpo.train", *QUICK, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "steps",
        "--save_steps", "1", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (out / LOCK_FILE).exists()  # released at the end
    return out


@pytest.fixture
def run_dir(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def resume(run_dir, *extra):
    return run_module(
        "hf_grpo.train", *QUICK, "--output_dir", str(run_dir), "--max_steps", "2", "--save_strategy", "steps",
        "--save_steps", "1", "--resume_from_checkpoint", "auto", *extra, timeout=300,
    )  # fmt: skip


def test_a_resume_with_another_lora_r_is_refused_before_the_model_loads(run_dir):
    """#4: the resume loaded the model, then died with a LoRA size-mismatch RuntimeError."""
    result = resume(run_dir, "--lora_r", "8")
    assert result.returncode == 2, result.stderr[-3000:]
    assert (run_dir / "checkpoint-2" / RECIPE_FILE).is_file()  # each checkpoint keeps the recipe it was trained with
    (error,) = errors_of(result.stderr)
    assert "lora_r 16 -> 8" in error and "checkpoint-2" in error and "another output_dir" in error
    assert "Traceback" not in result.stderr and "training on" not in result.stderr  # nothing loaded
    assert not (run_dir / "checkpoint-3").exists()


def stopped_in_its_last_evaluation(run_dir, checkpoints: bool = True):
    """``run_dir`` as a stop during the evaluation after training leaves it: trained to max_steps, the adapter saved,
    the records of the evaluation before training there, nothing after (with ``checkpoints``: checkpoint-2 too)."""
    for name in (*OUTPUTS, EVAL_RECORDS.format(label="after")):
        (run_dir / name).unlink()
    if not checkpoints:
        for folder in run_dir.glob("checkpoint-*"):
            shutil.rmtree(folder)
    return {name: (run_dir / name).read_bytes() for name in ("adapter_model.safetensors", "eval_before.jsonl")}


def assert_finished_without_training(run_dir, kept: dict, finished: dict):
    """The outputs the run lacked are written (the evaluation after training on the trained adapter), no step was
    trained, and the evaluation before training was not repeated."""
    assert all((run_dir / name).is_file() for name in OUTPUTS)
    results = json.loads((run_dir / EVAL_FILE).read_text())
    assert results["after"] == finished["after"] and results["before"] == finished["before"]
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    assert max(r["step"] for r in json.loads((run_dir / HISTORY_FILE).read_text())) == 2
    assert not (run_dir / "checkpoint-3").exists() and CARD_MARKER in (run_dir / CARD_FILE).read_text()


@pytest.mark.parametrize("checkpoints", [True, False], ids=["checkpoint", "weights only"])
def test_a_run_stopped_in_its_last_evaluation_resumes_into_what_it_lacks(finished_run, run_dir, caplog, checkpoints):
    """Ctrl-C during the evaluation after training: the resume said "finished, nothing to train" and exited 0, and
    the run never got its evaluation, summary, plot or card (with no checkpoint it trained again from step 0)."""
    finished = json.loads((finished_run / EVAL_FILE).read_text())
    kept = stopped_in_its_last_evaluation(run_dir, checkpoints)
    args = [*QUICK, "--output_dir", str(run_dir), "--max_steps", "2", "--resume_from_checkpoint", "auto"]
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert train_main(args) == 0
    err = caplog.text
    assert "finished training" in err and "but lacks eval_results.json (the after-evaluation)" in err, err[-3000:]
    assert "writing them now, without training" in err and "held-out accuracy (before): from the run's records" in err
    assert_finished_without_training(run_dir, kept, finished)


def test_the_report_finishes_a_run_stopped_in_its_last_evaluation(finished_run, run_dir):
    finished = json.loads((finished_run / EVAL_FILE).read_text())
    kept = stopped_in_its_last_evaluation(run_dir)
    result = run_module("hf_grpo.report", str(run_dir), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the run lacks its after-evaluation; finishing it: " in result.stderr
    assert_finished_without_training(run_dir, kept, finished)


def test_a_checkpoint_hf_grpo_did_not_write_is_refused_before_the_model_loads(run_dir, capsys):
    """It was resumed from with a warning, loaded, and (another trainer's) ended in a traceback."""
    foreign = run_dir / "checkpoint-2"
    (foreign / CHECKPOINT_MANIFEST).unlink()
    args = [*QUICK, "--output_dir", str(run_dir), "--max_steps", "3", "--resume_from_checkpoint", str(foreign)]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    (error,) = errors_of(err)
    assert f"{foreign} has no {CHECKPOINT_MANIFEST}: hf_grpo did not write it" in error, error
    assert "the newest complete one is" in error and "model_name_or_path" in error, error
    assert "Traceback" not in err and "training on" not in err  # nothing loaded


def test_a_finished_run_resumed_says_so_and_trains_nothing(run_dir):
    """#5: a 2-step run resumed trained a third step (checkpoint-3 with max_steps 2) and rewrote its outputs."""
    before = {name: (run_dir / name).read_bytes() for name in (HISTORY_FILE, RECIPE_FILE, "adapter_model.safetensors")}
    result = resume(run_dir, "--learning_rate", "1e-3")  # a changed key that does not fix shapes: a warning
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is finished: it trained to step 2; nothing to train (raise max_steps to train on)" in result.stderr
    assert "learning_rate 0.002 -> 0.001" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "checkpoint-3").exists() and not (run_dir / LOCK_FILE).exists()
    assert {name: (run_dir / name).read_bytes() for name in before} == before


@pytest.mark.slow  # two runs, one after the other: the first holds the lock while the second is checked
def test_a_second_run_into_the_same_output_dir_is_refused_while_the_first_runs(tmp_path):
    """#3: two runs into one output_dir both exited 0, the folder ending with a mix of their outputs. The first run
    is frozen (SIGSTOP) once it holds the lock, so that it still runs, however fast, while the second is checked;
    thawed, it trains to its end (one generation round a step: the untrained policy's groups all score 0, and
    dynamic sampling would look 16 rounds further for each)."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "hf_grpo.train", *QUICK, "--output_dir", str(out), "--max_steps", "2",
         "--dynamic_sampling", "false"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: (out / LOCK_FILE).exists() or first.poll() is not None, 240)
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, first.stderr.read()[-3000:]
        holder = json.loads((out / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid and "hf_grpo.train" in holder["command"]
        second = run_module("hf_grpo.train", *QUICK, "--output_dir", str(out), "--max_steps", "7", timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        (error,) = errors_of(second.stderr)
        assert f"pid {first.pid}" in error and "hf_grpo.train" in error and "another output_dir" in error
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=600)
        assert first.returncode == 0, err[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert not (out / LOCK_FILE).exists()
    assert "max_steps: 2" in (out / RECIPE_FILE).read_text()  # the first run's recipe, not the refused one's
    steps = [r["step"] for r in json.loads((out / HISTORY_FILE).read_text()) if "reward" in r]
    assert steps == [1, 2]  # the first run's training, untouched by the refused one


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_lock(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "command": "python -m x", **holder}))


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    pid = dead_pid()
    write_lock(tmp_path, pid=pid)
    run_lock.check_free(tmp_path)  # a dead holder does not count
    lock = run_lock.acquire(tmp_path)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"pid {pid}" in caplog.text and "no longer runs" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]  # no temporary or moved-aside file left
    run_lock.release(lock)
    assert not lock.exists()


def test_a_live_lock_is_refused_and_never_taken_over(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path, pid=sleeper.pid)
        with pytest.raises(run_lock.RunLockError, match=f"pid {sleeper.pid}.*python -m x.*another output_dir"):
            run_lock.acquire(tmp_path)
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == sleeper.pid
        run_lock.release(tmp_path / LOCK_FILE)  # not ours: left alone
        assert (tmp_path / LOCK_FILE).exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lock_from_another_host_names_the_file_to_delete(tmp_path):
    write_lock(tmp_path, pid=1, host="elsewhere")
    with pytest.raises(run_lock.RunLockError, match=f"on host elsewhere.*delete {tmp_path / LOCK_FILE}"):
        run_lock.check_free(tmp_path)


def test_a_lock_with_my_pid_on_another_host_is_another_run(tmp_path):
    """Containers on two nodes give their main process the same pid; a lock holding this process's pid
    but written on another host (or by an earlier process with this pid) is another run's: refused, never released."""
    write_lock(tmp_path, pid=os.getpid(), host="node-2")
    with pytest.raises(run_lock.RunLockError, match="on host node-2"):
        run_lock.check_free(tmp_path)
    with pytest.raises(run_lock.RunLockError, match="on host node-2"):
        run_lock.acquire(tmp_path)
    run_lock.release(tmp_path / LOCK_FILE)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "node-2"
    # same host and pid, other start time: a reused pid's lock, not this process's; released by nobody but its owner
    write_lock(tmp_path, pid=os.getpid(), start_ticks="1")
    run_lock.release(tmp_path / LOCK_FILE)
    assert (tmp_path / LOCK_FILE).exists()


def test_the_launcher_checks_the_lock_before_starting_anything(tmp_path):
    """``python -m hf_grpo.train`` with several processes checks through ``resume_target`` before the launch."""
    from hf_grpo.recipe import RecipeError
    from hf_grpo.run.pipeline import resume_target

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path, pid=sleeper.pid)
        args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=None)
        with pytest.raises(RecipeError, match=f"pid {sleeper.pid}"):
            resume_target(args, 2)
        assert resume_target(args, 2, lock=False) is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert resume_target(args, 2) is None  # its holder is gone: a stale lock is no refusal
