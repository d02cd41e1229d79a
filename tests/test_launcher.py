"""The launcher end to end (``python -m hf_grpo.train`` with a server): a killed server ends the run with one clear
line; a launcher's stop kills workers that ignore it; a SIGKILLed launcher leaves no process behind (its watchdog);
stopping the server stops its engine workers. A launch that starts its server, trains and stops it, and one signalled
while the server starts or mid-checkpoint that leaves no process behind and resumes: tests/test_launch_resume.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers.common import REPO
from .helpers.fake_vllm_server import start_subprocess
from .helpers.launching import (
    COMMON,
    RUN_MARK,
    kill_marked,
    launched,
    marked_processes,
    wait_until,
)


# ----------------------------------------------------------------------------------------------------------------------
# End to end: the command line, the launcher and a server that dies


def test_launcher_finds_programs_beside_python_or_names_the_missing_one(monkeypatch):
    from hf_grpo.launch.launcher import ProgramNotFound, resolve_program

    monkeypatch.setenv("PATH", "/nonexistent")  # a venv used as .venv/bin/python without activating it
    resolved = resolve_program(["accelerate", "launch", "-m", "hf_grpo.train"])
    assert resolved[0] == str(Path(sys.executable).parent / "accelerate") and resolved[1:] == [
        "launch",
        "-m",
        "hf_grpo.train",
    ]
    with pytest.raises(ProgramNotFound, match=r"`vllm` is not on PATH.*pip install -e '\.\[vllm\]'"):
        resolve_program(["vllm", "serve", "Qwen/Qwen2.5-Math-1.5B"])


def no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr[-6000:]
    assert 'File "' not in stderr, stderr[-6000:]  # not a frame of ours either


def test_a_killed_server_ends_the_run_with_one_line_naming_it_its_logs_and_the_resume_command(policy_dir, tmp_path):
    """A server that dies mid-run (one the user started) ends the run, once the client's retries are spent, with
    exit status 1 and one line a user can act on: which server stopped answering, where its log and the traceback
    are, the resume command; no Python traceback."""
    server = start_subprocess(policy_dir, enable_lora=True, max_lora_rank=8)
    out = tmp_path / "killed"
    args = [
        *COMMON, "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--max_steps", "500",
        "--generation.backend", "vllm_server", "--generation.base_url", server.url,
        "--generation.request_timeout", "5", "--generation.max_retries", "1", "--eval_before_after", "false",
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hf_grpo.train", *args],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        history = out / "training_history.json"
        assert wait_until(  # let it train a couple of steps
            lambda: (
                proc.poll() is not None or (history.exists() and len(json.loads(history.read_text() or "[]")) >= 2)
            ),
            300,
        )
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        server.kill()
        # bounded by the code (max_retries 1: two attempts, request_timeout 5 s each); this only catches a hang
        _, stderr = proc.communicate(timeout=300)
    finally:
        server.stop()
    assert proc.returncode == 1, stderr[-4000:]
    no_traceback(stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(errors) == 1, stderr[-4000:]
    line = errors[0]
    assert f"the vLLM server at {server.url} stopped answering" in line and "vllm serve" in line
    # it gave up as its retries say: after max_retries + 1 attempts, or at once for a request left unanswered
    assert "after 2 attempts" in line or "a request is not resent" in line, line
    assert "its log: wherever you started the server" in line
    log = Path(re.search(r"the traceback: (\S+);", line).group(1))
    assert log.parent == out / "logs" and "VLLMConnectionError" in log.read_text()
    assert "Traceback (most recent call last)" in log.read_text()
    assert line.endswith(f"resume with: python -m hf_grpo.train {' '.join(args)} --resume_from_checkpoint auto")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_workers_that_ignore_the_stop_signal_are_killed_with_the_launch(signum):
    """After the grace period the launcher killed only `accelerate launch`, orphaning its workers."""
    mark = f"stubborn-{os.getpid()}-{signum}-{time.monotonic_ns()}"
    with launched(
        [sys.executable, "-m", "tests.scripts.stubborn_launch"], mark, stdout=subprocess.PIPE, text=True
    ) as launcher:
        assert launcher.stdout.readline().strip() == "launched"
        # launcher, its watchdog, launch, worker
        assert wait_until(lambda: len(marked_processes(mark)) == 4, 120), marked_processes(mark)
        launcher.send_signal(signum)
        # The launcher's stop is bounded by its code (2 s grace, SIGKILL, the watchdog told to exit), not by a number
        # of seconds on a loaded machine: this wait only catches a hang (it failed once at 30 s under load ~4.5).
        assert launcher.wait(timeout=300) == 130
        # its groups were SIGKILLed before it returned: only the kernel's reaping is left
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)


def test_a_sigkilled_launcher_leaves_no_process_behind(tmp_path):
    """A SIGKILLed launcher stops nothing itself; its watchdog stops the server's and the training launch's
    process groups, SIGKILLing the workers that ignore SIGTERM after its grace period."""
    mark = f"sigkilled-{os.getpid()}-{time.monotonic_ns()}"
    with launched(
        [sys.executable, "-m", "tests.scripts.stubborn_launch", "--server", str(tmp_path)],
        mark,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as launcher:
        assert launcher.stdout.readline().strip() == "launched"
        # launcher, server, engine worker, launch, worker (and, with its watchdog, one more)
        assert wait_until(
            lambda: sum("hf_grpo.base.watchdog" not in c for c in marked_processes(mark).values()) == 5, 30
        ), marked_processes(mark)
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not marked_processes(mark), 15), marked_processes(mark)
        assert "hf_grpo watchdog: the launcher died" in launcher.stderr.read()


def test_a_launch_that_ends_dismisses_its_watchdog(tmp_path):
    """The launcher stops its groups itself, then its watchdog exits without signalling anything."""
    mark = f"finished-{os.getpid()}-{time.monotonic_ns()}"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tests.scripts.stubborn_launch", "--server", str(tmp_path), "--finish"],
            cwd=REPO,
            env={**os.environ, RUN_MARK: mark},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert not [c for c in marked_processes(mark).values() if "hf_grpo.base.watchdog" in c]
        assert "hf_grpo watchdog" not in result.stderr
        assert wait_until(lambda: not marked_processes(mark), 10), marked_processes(mark)
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("end", ["done", "eof"])
def test_the_watchdog_stops_its_groups_only_when_the_launcher_dies(end):
    """``done`` dismisses the watchdog, leaving the groups alone; end of file without it stops them all (SIGKILL for
    a group that ignores SIGTERM)."""
    from hf_grpo.base.watchdog import Watchdog

    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
    )
    groups = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
        for code in ("import time; print(flush=True); time.sleep(600)", ignores_term)
    ]
    watchdog = Watchdog(grace_s=1.0)
    try:
        for group in groups:
            group.stdout.readline()  # started, SIGTERM handler set
            watchdog.watch(group.pid)
        if end == "done":
            watchdog.dismiss()
            time.sleep(1.5)
            assert [group.poll() for group in groups] == [None, None]
        else:
            watchdog.process.stdin.close()
            assert watchdog.process.wait(timeout=10) == 0
            assert [group.wait(timeout=1) for group in groups] == [-signal.SIGTERM, -signal.SIGKILL]
    finally:
        for group in groups:
            group.kill()
            group.communicate()
        if watchdog.process.poll() is None:
            watchdog.process.kill()


def test_stopping_the_server_stops_its_engine_workers_too(tmp_path):
    """Stopping the server waited for the group leader only; an engine worker that outlives it (here one
    that ignores SIGTERM) was left running, holding its GPU."""
    from hf_grpo.generation.server import VLLMServerProcess

    mark = f"server-{os.getpid()}-{time.monotonic_ns()}"
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    leader = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(600)"
    server = VLLMServerProcess(
        [sys.executable, "-c", leader], {RUN_MARK: mark}, "http://127.0.0.1:9", tmp_path / "server.log", 10
    )
    server.start()
    try:
        assert wait_until(lambda: len(marked_processes(mark)) == 2, 30), marked_processes(mark)
        server.stop(grace_s=5)
        assert wait_until(lambda: not marked_processes(mark), 10), marked_processes(mark)
    finally:
        kill_marked(mark)


# ----------------------------------------------------------------------------------------------------------------------
# The launcher's closing line: what it knows, no more


LAUNCH_ENDINGS = {  # a training launch that ends so
    "silently": "import sys; sys.exit(1)",
    "with an error line": (
        "import sys; from hf_grpo.base.crash_log import mark_error; sys.stderr.write('hf_grpo: error: it broke\\n'); "
        "mark_error(); sys.exit(2)"
    ),
    "stopped by SIGTERM": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("ending", LAUNCH_ENDINGS)
def test_the_launchers_closing_line_claims_no_error_line_nor_logs_folder_it_has_not_seen(
    ending, tmp_path, capfd, monkeypatch
):
    """It said "its error is the `hf_grpo: error:` line above (tracebacks in OUTPUT_DIR/logs/)" however the launch
    ended: after a launch killed by a signal, or one whose error printed no such line, and with no logs folder."""
    from types import SimpleNamespace

    from hf_grpo.launch import launcher as launch

    out = tmp_path / "run"
    out.mkdir()
    if ending == "with an error line":
        (out / "logs").mkdir()
    recipe = SimpleNamespace(training=SimpleNamespace(output_dir=str(out)), layout=SimpleNamespace(num_processes=1))
    command = launch.Command("train", {}, [sys.executable, "-c", LAUNCH_ENDINGS[ending]])
    monkeypatch.setattr(launch, "plan_commands", lambda recipe, argv: [command])
    code = launch.run_launcher(recipe, ["recipes/tiny.yaml"])
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("hf_grpo: ")]
    closing = lines[-1]
    assert closing.endswith("resume with: python -m hf_grpo.train recipes/tiny.yaml --resume_from_checkpoint auto")
    if ending == "stopped by SIGTERM":  # a stop sent to the launch, not to the launcher: the same end as one here
        assert (code, len(lines)) == (130, 1) and closing.startswith("hf_grpo: stopped by a signal;"), lines
        return
    assert closing.startswith("hf_grpo: training stopped with exit code "), lines
    assert ("`hf_grpo: error:` line above" in closing) == (ending == "with an error line"), closing
    assert ("/logs/" in closing) == (ending == "with an error line"), closing  # only a folder that exists
    if ending == "killed":
        assert code == -signal.SIGKILL and "killed by SIGKILL" in closing, closing
