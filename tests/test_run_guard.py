"""One run per ``output_dir`` (its lock), a resume with a recipe whose shapes changed is refused before
anything loads, and a finished run resumed says so and trains nothing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hf_grpo import run_lock
from hf_grpo.run_files import HISTORY_FILE, LOCK_FILE, RECIPE_FILE

from .helpers.common import REPO, run_module
from .helpers.launching import wait_until


pytestmark = pytest.mark.subprocess

QUICK = [
    "--warm_start_steps", "0", "--arithmetic_train_size", "64", "--arithmetic_eval_size", "8",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "8",
    "--eval_before_after", "false", "--task_eval_steps", "0", "--logging_steps", "1",
]  # fmt: skip


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


def test_a_finished_run_resumed_says_so_and_trains_nothing(run_dir):
    """#5: a 2-step run resumed trained a third step (checkpoint-3 with max_steps 2) and rewrote its outputs."""
    before = {name: (run_dir / name).read_bytes() for name in (HISTORY_FILE, RECIPE_FILE, "adapter_model.safetensors")}
    result = resume(run_dir, "--learning_rate", "1e-3")  # a changed key that does not fix shapes: a warning
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is finished" in result.stderr and "checkpoint-2 is at step 2 of max_steps 2" in result.stderr
    assert "learning_rate 0.002 -> 0.001" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "checkpoint-3").exists() and not (run_dir / LOCK_FILE).exists()
    assert {name: (run_dir / name).read_bytes() for name in before} == before


@pytest.mark.slow  # two runs at once (about 60 s)
def test_a_second_run_into_the_same_output_dir_is_refused_while_the_first_runs(tmp_path):
    """#3: two runs into one output_dir both exited 0, the folder ending with a mix of their outputs."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "hf_grpo.train", *QUICK, "--output_dir", str(out), "--max_steps", "12"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: (out / LOCK_FILE).exists() or first.poll() is not None, 240)
        assert first.poll() is None, first.stderr.read()[-3000:]
        holder = json.loads((out / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid and "hf_grpo.train" in holder["command"]
        second = run_module("hf_grpo.train", *QUICK, "--output_dir", str(out), "--max_steps", "2", timeout=300)
        assert first.poll() is None, "the first run ended before the second was checked: make it longer"
        assert second.returncode == 2, second.stderr[-3000:]
        (error,) = errors_of(second.stderr)
        assert f"pid {first.pid}" in error and "hf_grpo.train" in error and "another output_dir" in error
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert not (out / LOCK_FILE).exists()
    assert "max_steps: 12" in (out / RECIPE_FILE).read_text()  # the first run's recipe, not the refused one's


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
    from hf_grpo.pipeline import resume_target
    from hf_grpo.recipe import RecipeError

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
