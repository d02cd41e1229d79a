"""Stopping README's commands: SIGTERM to ``accelerate launch -m hf_grpo.train`` itself, SIGTERM to
``python -m hf_grpo.train`` while it evaluates before training, and SIGINT twice to the launcher. Each leaves no
process running (trainer, reward workers, multiprocessing's helpers, accelerate) and ends with one
``hf_grpo: stopped by a signal ...; resume with: ...`` line and no traceback. Real processes, the tiny recipe.

    .venv/bin/python -m pytest -q tests/test_stop_signals.py --tier 2
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .helpers.common import REPO
from .helpers.launching import COMMON, RUN_MARK, kill_marked, loads_torch, marked_processes, wait_until


pytestmark = [pytest.mark.subprocess, pytest.mark.slow]
TINY_RUN = [*COMMON, "--max_steps", "500", "--report_to", "none"]


def start(argv: list[str], mark: str, stderr_path) -> subprocess.Popen:
    with open(stderr_path, "w") as stderr:
        return subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        )  # fmt: skip


def assert_one_stop_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-4000:]
    lines = [line for line in stderr.splitlines() if line.startswith("hf_grpo: stopped by a signal")]
    assert len(lines) == 1, stderr[-4000:]
    assert "resume with: " in lines[0] and lines[0].endswith("--resume_from_checkpoint auto"), lines[0]


def training(out) -> bool:
    """The run is past its start: it holds its output_dir's lock (taken before the evaluation and training)."""
    return (out / "hf_grpo.lock").is_file()


def test_sigterm_to_accelerate_launch_leaves_no_training_process(tmp_path):
    """`accelerate launch` exits at once on SIGTERM; its training process used to keep training, orphaned, with
    its reward workers and multiprocessing's helpers (5 processes). It now gets SIGTERM when its parent dies."""
    mark, out, err = f"acc-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "run", tmp_path / "stderr.txt"
    argv = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "hf_grpo.train", *TINY_RUN,
        "--output_dir", str(out), "--eval_before_after", "false",
    ]  # fmt: skip
    launch = start(argv, mark, err)
    try:
        assert wait_until(lambda: launch.poll() is not None or training(out), 240), err.read_text()[-3000:]
        assert launch.poll() is None, err.read_text()[-3000:]
        assert wait_until(lambda: (out / "training_history.json").is_file() or launch.poll() is not None, 240)
        launch.send_signal(signal.SIGTERM)
        launch.wait(timeout=60)
        # bounded by what the code guarantees: the trainer handles the SIGTERM its parent's death sends it
        assert wait_until(lambda: not marked_processes(mark), 120), marked_processes(mark)
    finally:
        kill_marked(mark)
    assert_one_stop_line(err.read_text())
    assert not (out / "hf_grpo.lock").exists()  # released


def test_sigterm_during_the_evaluation_before_training_ends_with_one_line(tmp_path):
    """SIGTERM to `python -m hf_grpo.train` while it evaluated before training exited 143 with no line."""
    mark, out, err = f"eval-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "run", tmp_path / "stderr.txt"
    argv = [
        sys.executable,
        "-m",
        "hf_grpo.train",
        *TINY_RUN,
        "--output_dir",
        str(out),
        "--arithmetic_eval_size",
        "4000",
    ]
    run = start(argv, mark, err)
    try:
        assert wait_until(lambda: run.poll() is not None or training(out), 240), err.read_text()[-3000:]
        assert run.poll() is None and not (out / "eval_before.jsonl").exists(), err.read_text()[-3000:]
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=120) == 130, err.read_text()[-4000:]
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    finally:
        kill_marked(mark)
    assert_one_stop_line(err.read_text())


def test_sigint_twice_to_the_launcher_stops_at_once_without_a_traceback(tmp_path):
    """A second Ctrl-C while the launcher stopped its launches raised KeyboardInterrupt inside the stop: two
    tracebacks. Now the second signal kills what is left at once."""
    mark, out, err = f"twice-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "run", tmp_path / "stderr.txt"
    argv = [
        sys.executable, "-m", "hf_grpo.train", *TINY_RUN, "--output_dir", str(out), "--num_processes", "2",
        "--accelerate_config", "cpu", "--eval_before_after", "false",
    ]  # fmt: skip
    launcher = start(argv, mark, err)
    try:
        assert wait_until(lambda: launcher.poll() is not None or training(out), 240), err.read_text()[-3000:]
        assert launcher.poll() is None, err.read_text()[-3000:]
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the second press; whenever it comes, it must not raise
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=120) == 130, err.read_text()[-4000:]
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    finally:
        kill_marked(mark)
    assert_one_stop_line(err.read_text())


def training_processes(mark: str, launcher: int) -> list[int]:
    """The training processes of a launch (``python [-u] -m hf_grpo.train``, not the launcher nor its wrapper)."""
    return [
        pid
        for pid, command in marked_processes(mark).items()
        if "-m hf_grpo.train" in command and "hf_grpo.base.crash_log" not in command and pid != launcher
    ]


def starting(mark: str, launcher: int) -> bool:
    """Both training processes of a 2-process launch exist and import torch."""
    pids = training_processes(mark, launcher)
    return len(pids) == 2 and all(loads_torch(pid) for pid in pids)


def wrapper(mark: str) -> int:
    """The pid of the launch's `accelerate launch` (run by hf_grpo.base.crash_log)."""
    (pid,) = [pid for pid, command in marked_processes(mark).items() if "-m hf_grpo.base.crash_log" in command]
    return pid


@pytest.mark.parametrize(
    ("target", "signame"),
    [("launcher", "SIGTERM"), ("launcher", "SIGHUP"), ("accelerate launch", "SIGTERM")],
)
def test_a_stop_while_the_training_processes_start_ends_with_one_line_and_leaves_nothing(target, signame, tmp_path):
    """The tests above signal a run that trains. In the start-up window (the training processes exist, importing
    torch; nothing trains yet): SIGTERM to the launcher printed KeyboardInterrupt tracebacks from the training
    processes; SIGHUP (a closed terminal) killed the launcher with no line; SIGTERM to `accelerate launch` left a
    closing line pointing at an `hf_grpo: error:` line that was not there."""
    mark = f"start-{os.getpid()}-{signame}-{time.monotonic_ns()}"
    out, err = tmp_path / "run", tmp_path / "stderr.txt"
    argv = [
        sys.executable, "-m", "hf_grpo.train", *TINY_RUN, "--output_dir", str(out), "--num_processes", "2",
        "--accelerate_config", "cpu", "--eval_before_after", "false",
    ]  # fmt: skip
    launcher = start(argv, mark, err)
    try:
        # both training processes exist and load torch: past their first lines (a signal in the milliseconds before
        # those, while Python starts, is Python's); the launch is in its start-up, nothing trains yet
        started = wait_until(lambda: launcher.poll() is not None or starting(mark, launcher.pid), 240)
        assert started, (marked_processes(mark), err.read_text()[-3000:])
        assert launcher.poll() is None and not training(out), err.read_text()[-3000:]  # started, not training
        os.kill(launcher.pid if target == "launcher" else wrapper(mark), signal.Signals[signame])
        assert launcher.wait(timeout=120) == 130, err.read_text()[-4000:]
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    finally:
        kill_marked(mark)
    text = err.read_text()
    assert_one_stop_line(text)
    assert "hf_grpo: error" not in text and "hf_grpo: training stopped" not in text, text[-3000:]
    assert not (out / "hf_grpo.lock").exists()
