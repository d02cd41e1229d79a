"""Launching ``python -m hf_grpo.train`` (and stand-ins) in real processes: the shared command-line arguments, the
fixture server's serve command, finding every process a test's run started (by a mark in its environment), and
``launched``, which starts a launcher and, however the test ends, leaves none of its processes behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .common import REPO


FIXTURE_SERVE = f"[{sys.executable}, -m, tests.helpers.fake_vllm_server, --model]"
RUN_MARK = "HF_GRPO_TEST_RUN_MARK"
# The tiny recipe on an untrained model (or the fixture policy) with small batches. Its groups seldom differ, so
# dynamic sampling would generate all of the recipe's 16 rounds at every step (4 s a step on 2 processes): 2 rounds
# keep it on, with further rounds, carried groups and prompt selection's draws, at a fraction of the time.
COMMON = [
    "recipes/tiny.yaml",
    "--warm_start_steps",
    "0",
    "--per_device_train_batch_size",
    "16",
    "--num_generations",
    "4",
    "--max_completion_length",
    "10",
    "--arithmetic_train_size",
    "64",
    "--arithmetic_eval_size",
    "8",
    "--logging_steps",
    "1",
    "--lora_r",
    "8",
    "--lora_alpha",
    "16",
    "--max_generation_batches",
    "2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train(*args, timeout=600, **popen):
    return subprocess.run(
        [sys.executable, "-m", "hf_grpo.train", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **popen,
    )


def marked_processes(mark: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``RUN_MARK=mark``: pid -> command line."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"{RUN_MARK}={mark}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def kill_marked(mark: str) -> None:
    """SIGKILL every process of the mark (cleanup, or a machine dying: the assertions are the test's). All are frozen
    (SIGSTOP) before any is killed: a launched training process takes its launcher's death as Ctrl-C
    (``PR_SET_PDEATHSIG``) and ends cleanly, its lock released, if it runs in the gap between two kills (CI, loaded)."""
    pids = marked_processes(mark)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def wait_until(condition, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``condition()`` until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(interval)
    return bool(condition())


@contextlib.contextmanager
def launched(command: list[str], mark: str, env: dict | None = None, **popen):
    """Start ``command`` from the repository root with ``RUN_MARK=mark`` added to ``env`` (default: this process's
    environment) and yield its ``Popen``; on the way out, SIGKILL every process of the mark and the launcher itself
    if it still runs (cleanup only: what the run must have done is for the test to assert)."""
    launcher = subprocess.Popen(
        command, cwd=REPO, env={**(os.environ if env is None else env), RUN_MARK: mark}, **popen
    )
    try:
        yield launcher
    finally:
        kill_marked(mark)
        if launcher.poll() is None:
            launcher.kill()


def loads_torch(pid: int) -> bool:
    """Whether process ``pid`` has started importing torch (its library is mapped): a ``python -m hf_grpo.train``
    is then past its first lines, where it sets up its stop handling. False once it is gone."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
