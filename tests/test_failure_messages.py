"""A run ended by an error on one of its processes, or by a stop landing while a process says why it ended, prints
one line a user can act on (what happened, where the traceback is, the resume command), no Python traceback, and
leaves nothing running; a frozen server still ends by its SIGTERM. The same for a killed vLLM server:
tests/test_launcher.py; for Ctrl-C of a 2-process launch (what was saved, the resume command):
tests/test_launch_resume.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hf_grpo import train
from hf_grpo.base import crash_log
from hf_grpo.base.crash_log import resume_command
from hf_grpo.generation.server import VLLMServerProcess
from hf_grpo.launch.launcher import free_port
from hf_grpo.rewards.wrapper import RewardFailedError

from .helpers.common import REPO
from .helpers.launching import COMMON, RUN_MARK, kill_marked, marked_processes, wait_until


def test_the_resume_command_repeats_the_arguments_with_resume_auto(monkeypatch):
    monkeypatch.delenv("HF_GRPO_COMMAND", raising=False)
    argv = ["recipes/tiny.yaml", "--seed", "3", "--resume_from_checkpoint", "out/checkpoint-2", "--run_name", "a b"]
    assert resume_command(argv) == (
        "python -m hf_grpo.train recipes/tiny.yaml --seed 3 --run_name 'a b' --resume_from_checkpoint auto"
    )
    monkeypatch.setenv("HF_GRPO_COMMAND", "recipes/tiny.yaml --num_processes 2")  # a launched process: the launch's
    assert resume_command(["--generation.base_url", "http://x"]).endswith(
        "--num_processes 2 --resume_from_checkpoint auto"
    )


def no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr[-6000:]
    assert 'File "' not in stderr, stderr[-6000:]  # not a frame of ours either


HANDLES_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(3)); print('ready', flush=True); "
    "time.sleep(600)"
)


def test_a_frozen_server_is_continued_so_that_it_ends_by_sigterm_not_after_the_grace(tmp_path):
    """A SIGSTOPped server held SIGTERM pending for the whole grace, then got SIGKILL; SIGCONT after the
    SIGTERM lets it end at once. Asserted by how it ended (its SIGTERM handler's exit, not SIGKILL), not by a time.
    The stand-in handles SIGTERM as vLLM's server does: a default-action SIGTERM kills even a stopped process."""
    server = VLLMServerProcess(
        [sys.executable, "-c", HANDLES_SIGTERM],
        {},
        f"http://127.0.0.1:{free_port()}",
        tmp_path / "s.log",
        30,
    )
    server.start()
    assert wait_until(lambda: "ready" in (tmp_path / "s.log").read_text(), timeout=300)  # its handler is set
    os.killpg(server.process.pid, signal.SIGSTOP)
    server.stop(grace_s=120)
    assert server.process.returncode == 3


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow  # a 2-process launch (it ends at its first step)
def test_an_error_on_one_rank_ends_every_rank_with_its_one_line(tmp_path):
    """One process failing (here its reward breaks the contract on rank 1 only) while the other
    waits in the next collective. The other is not left blocked: accelerate's agent stops it, the failing rank's
    error is the one `hf_grpo: error:` line, the launcher's summary points at it, and nothing is left running."""
    mark = f"one-rank-{os.getpid()}-{time.monotonic_ns()}"
    out = tmp_path / "run"
    # the reward's 3 failed calls (reward_max_failed_calls) in the first step's generation rounds, before anything
    # trains: COMMON's 2 rounds would train a step first, and DDP's first backward prints a [rank0] warning
    args = [
        *COMMON, "--output_dir", str(out), "--num_processes", "2", "--accelerate_config", "cpu",
        "--eval_before_after", "false", "--max_steps", "3", "--max_generation_batches", "3",
        "--reward_funcs", "[tests.helpers.reward_plugins:one_too_many_on_rank_1]",
    ]  # fmt: skip
    try:
        # bounded by the run itself: without the agent stopping rank 0 this would wait in gloo's collective (30 min)
        result = subprocess.run(
            [sys.executable, "-m", "hf_grpo.train", *args], check=False, cwd=REPO, capture_output=True, text=True,
            timeout=600,
            env={**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert wait_until(lambda: not marked_processes(mark), 15), marked_processes(mark)
    finally:
        kill_marked(mark)
    stderr = result.stderr
    assert result.returncode not in (0, None), stderr[-3000:]
    # no traceback on the console (the waiting rank's echo included): each failure is in rank 1's reward log
    assert "Traceback (most recent call last)" not in stderr, stderr[-6000:]
    logged = (out / "logs" / "reward_errors-1.log").read_text()
    assert logged.count("one_too_many_on_rank_1") >= 1 and "got 2 rewards for 1 completion" in logged, logged[-3000:]
    assert "[rank0]" not in stderr and "closed by peer" not in stderr, stderr[-4000:]
    errors = [line for line in stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(errors) == 1 and "one_too_many_on_rank_1" in errors[0], stderr[-4000:]
    summary = [line for line in stderr.splitlines() if line.startswith("hf_grpo: training stopped with exit code")]
    assert len(summary) == 1 and "resume with:" in summary[0], stderr[-4000:]


def signalled_while(monkeypatch, module, name: str) -> None:
    """``module.name`` sends this process SIGTERM before it does its work: a stop landing exactly there."""
    original = getattr(module, name)

    def landing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, landing)


@pytest.mark.parametrize(
    "error, lands_in, says",
    [
        (RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1"), (crash_log, "write"), 0),
        (RewardFailedError("reward 'r' failed on every completion"), (crash_log, "mark_error"), 1),
    ],
)
def test_a_stop_landing_while_a_process_says_why_it_ended_leaves_its_one_line(
    tmp_path, monkeypatch, capsys, error, lands_in, says
):
    """CI: rank 1's reward broke; rank 0 lost its peer and, while writing its crash log, got the launch's SIGTERM,
    which left main() as a KeyboardInterrupt and printed two more tracebacks. A stop landing while a process says
    why it ended (its crash log; its error line written, the launcher not yet told) changes nothing it says."""

    def run(recipe):  # rank 0 of a 2-process run on one machine (set once the recipe has loaded)
        for name, value in (("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"), ("RANK", "0")):
            monkeypatch.setenv(name, value)
        raise error

    monkeypatch.setattr(train, "run", run)
    signalled_while(monkeypatch, *lands_in)
    out = tmp_path / "run"
    code = train.main([str(REPO / "recipes" / "tiny.yaml"), "--output_dir", str(out), "--report_to", "none"])
    err = capsys.readouterr().err
    no_traceback(err)
    assert code == 1, err
    assert [line for line in err.splitlines() if line.startswith("hf_grpo: error:")] == (
        [f"hf_grpo: error: {error}"] * says
    ), err
    assert len(list(out.glob("logs/crash-*.log"))) == 1 - says  # the echo of a lost peer: its crash log, once
