"""A 2-process launch (``python -m hf_grpo.train``: the launcher starts the stand-in vLLM server, then accelerate and
its two training processes) with dynamic sampling and prompt selection on, end to end, in one test because every
check needs the same launches:

* uninterrupted, the launcher starts the server (our flags reach it, the adapter is synced to it), trains to the end
  and stops the server: the reference run;
* SIGTERM while the server starts, then Ctrl-C (SIGINT) while both training processes write a checkpoint, each leave
  no process behind, and the stop prints one line naming the newest complete checkpoint and the resume command;
* ``--resume_from_checkpoint auto`` then skips the half-written checkpoint (the old resume picked it and failed on its
  missing trainer_state.json), continues from the previous one, and ends with the reference run's adapter bit for bit,
  having skipped the same prompts, with every process holding the reference run's prompt stream, carried groups and
  reward history (the same on both processes, which also agree on every group kept since the resume). Selection
  skips prompts before the checkpoint it resumes from, so the resumed history decides what the rest of the run
  generates.

The launcher runs in this process where nothing signals it (``hf_grpo.train.main``, as ``python -m`` would), in a
process of its own where the test signals it. Tier 2:

    .venv/bin/python -m pytest -q --tier 2 tests/test_launch_resume.py
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from hf_grpo.launch.launcher import free_port
from hf_grpo.train import main
from hf_grpo.training.checkpoints import MANIFEST, problem

from .helpers.common import REPO
from .helpers.launching import COMMON, FIXTURE_SERVE, RUN_MARK, kill_marked, launched, marked_processes, wait_until
from .helpers.resumes import assert_same_adapter, complete_checkpoints, process_states, skipped_by_step


pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.distributed]

STEPS = 6
# the slow_checkpoint sitecustomize, then tests/scripts for the patch_on_import it imports
SLOW_SAVE_PATH = os.pathsep.join(
    [str(REPO / "tests" / "scripts" / "slow_checkpoint"), str(REPO / "tests" / "scripts")]
)


def arguments(policy_dir, out, serve: str = FIXTURE_SERVE) -> list[str]:
    """The launch's arguments: 2 training processes, a checkpoint every 2 steps, prompt selection on."""
    return [
        *COMMON, "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--save_strategy", "steps",
        "--save_steps", "2", "--max_steps", str(STEPS), "--num_processes", "2", "--prompt_selection", "true",
        "--generation.backend", "vllm_server", "--generation.serve_command", serve,
        "--generation.server_timeout", "120", "--eval_before_after", "false",
    ]  # fmt: skip


def no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr[-6000:]
    assert 'File "' not in stderr, stderr[-6000:]  # not a frame of ours either


def launch_here(args: list[str], mark: str, monkeypatch) -> int:
    """``python -m hf_grpo.train args`` with the launcher in this process; what it starts carries the mark."""
    port = free_port()
    monkeypatch.setenv(RUN_MARK, mark)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main([*args, "--generation.port", str(port)])
    with pytest.raises(requests.ConnectionError):  # the launcher stopped its server when training ended
        requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
    return code


def signalled(args: list[str], mark: str, env: dict, ready, signum: int, stderr_path: Path) -> list[str]:
    """Launch ``args`` in a process of its own, send it ``signum`` once ``ready()``, and check that it stops with
    status 130 leaving no process of the mark; the command lines of the mark's processes when it was signalled."""
    with (
        open(stderr_path, "w") as stderr,
        launched(
            [sys.executable, "-m", "hf_grpo.train", *args], mark, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        ) as launcher,
    ):
        assert wait_until(lambda: ready() or launcher.poll() is not None, 240), marked_processes(mark)
        assert launcher.poll() is None, stderr_path.read_text()[-3000:]
        running = list(marked_processes(mark).values())
        launcher.send_signal(signum)
        assert launcher.wait(timeout=120) == 130, stderr_path.read_text()[-3000:]
        # the launcher SIGKILLs what is left of its groups before it returns: only the kernel's reaping is left
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    return running


def server_starting(mark: str) -> bool:
    """The never-healthy server of the mark runs (its own process, not the launcher whose argv names it)."""
    return any("sleep(600)" in c and "hf_grpo" not in c for c in marked_processes(mark).values())


def check_the_stop_line(stderr: str, args: list[str], out: Path) -> None:
    """One line, no traceback nor error: the newest complete checkpoint (not the one half-written) and the command."""
    no_traceback(stderr)
    assert "hf_grpo: error:" not in stderr, stderr[-4000:]
    summary = [line for line in stderr.splitlines() if line.startswith("hf_grpo: stopped by a signal")]
    assert len(summary) == 1, stderr[-4000:]
    saved = re.search(r"the newest complete checkpoint is (\S+);", summary[0]).group(1)
    assert Path(saved) == out / "checkpoint-2" and (Path(saved) / "trainer_state.json").is_file(), summary[0]
    assert summary[0].endswith(
        f"resume with: python -m hf_grpo.train {shlex.join(args)} --resume_from_checkpoint auto"
    )
    assert list((out / "logs").glob("crash-*.log")), "the tracebacks are kept in the run's logs/"


def check_the_reference_run(straight: Path, log: str) -> None:
    """The launcher started the server with our flags, synced the adapter to it and trained to the end; selection
    skipped prompts by step 2, so that the history checkpoint-2 holds decides what a resume from it generates."""
    assert "vLLM server healthy at http://127.0.0.1:" in log
    server_log = (straight / "vllm_server.log").read_text()
    assert "--gpu-memory-utilization" in server_log and "vllm_adapters/step-1" in server_log
    assert complete_checkpoints(straight) == [2, 4, STEPS]
    skipped = skipped_by_step(straight)
    first_skip = min((step for step, n in skipped.items() if n > 0), default=None)
    assert first_skip is not None and first_skip <= 2, (
        f"selection skipped too late for the resume to matter: {skipped}"
    )


def check_the_resumed_run(straight: Path, out: Path) -> None:
    """What the resumed run ends with is what the uninterrupted one ended with."""
    assert problem(out / "checkpoint-4", 2) is None and problem(out / f"checkpoint-{STEPS}", 2) is None
    assert skipped_by_step(out) == skipped_by_step(straight), "the resumed run skipped other prompts"
    assert_same_adapter(straight, out)
    reference, resumed = (process_states(run / f"checkpoint-{STEPS}", 2) for run in (straight, out))
    for rank, (a, b) in enumerate(zip(reference, resumed, strict=True)):
        for key in ("stream", "pool_groups", "selection"):
            assert a[key] == b[key], f"process {rank}'s {key} differs from the uninterrupted run's"
    assert resumed[0]["selection"] == resumed[1]["selection"], "the processes hold different reward histories"
    # the digest of the keep decisions this process made (since it started: not a checkpoint's to restore)
    assert resumed[0]["keep_digest"] == resumed[1]["keep_digest"], "the processes kept different groups"


@pytest.mark.timeout(1200)
def test_a_launch_signalled_in_server_start_up_or_mid_checkpoint_leaves_nothing_and_resumes_exactly(
    policy_dir, tmp_path, monkeypatch, caplog
):
    """The reference run; SIGTERM in server start-up and Ctrl-C mid-checkpoint, each leaving nothing behind; the
    resume that skips the half-written checkpoint and ends as the reference run did (the module's docstring)."""
    mark = f"launch-resume-{os.getpid()}-{time.monotonic_ns()}"
    straight, out, flag = tmp_path / "straight", tmp_path / "run", tmp_path / "saving"
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    caplog.set_level(logging.INFO, logger="hf_grpo")
    try:
        assert launch_here(arguments(policy_dir, straight), mark, monkeypatch) == 0
        check_the_reference_run(straight, caplog.text)

        # 1. SIGTERM while the server starts (a server that never becomes healthy: a large model still loading)
        never_healthy = f"[{sys.executable}, -c, 'import time; time.sleep(600)']"
        args = [*arguments(policy_dir, out, never_healthy), "--generation.port", str(free_port())]
        signalled(args, mark, env, lambda: server_starting(mark), signal.SIGTERM, tmp_path / "1.txt")
        assert not list(out.glob("checkpoint-*"))

        # 2. Ctrl-C while both training processes write checkpoint-4 (checkpoint-2 is complete, skips behind it)
        args = [*arguments(policy_dir, out), "--generation.port", str(free_port())]
        slow = {**env, "PYTHONPATH": SLOW_SAVE_PATH, "HF_GRPO_TEST_SLOW_SAVE": str(flag)}
        running = signalled(args, mark, slow, flag.exists, signal.SIGINT, tmp_path / "2.txt")
        assert sum("vllm_server" in c for c in running) >= 1 and sum("hf_grpo.train" in c for c in running) >= 4
        assert flag.read_text() == str(out / "checkpoint-4")
        assert problem(out / "checkpoint-2", 2) is None
        assert (out / "checkpoint-4" / "optimizer.pt").is_file() and not (out / "checkpoint-4" / MANIFEST).exists()
        check_the_stop_line((tmp_path / "2.txt").read_text(), args, out)

        # 3. The same command resumes from checkpoint-2 and saves a complete checkpoint-4, then checkpoint-6
        caplog.clear()
        assert launch_here([*arguments(policy_dir, out), "--resume_from_checkpoint", "auto"], mark, monkeypatch) == 0
    finally:
        kill_marked(mark)
    assert f"skipping {out / 'checkpoint-4'}" in caplog.text and f"resuming from {out / 'checkpoint-2'}" in caplog.text
    history = json.loads((out / "training_history.json").read_text())
    assert [r["step"] for r in history if "reward" in r][-4:] == [3, 4, 5, 6]
    check_the_resumed_run(straight, out)
