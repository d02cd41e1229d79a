"""Stop signals (``hf_grpo.base.stopping``): SIGINT, SIGTERM and SIGHUP end a run with status 130 wherever they land, and
a stop that Python or a library dropped is raised at the next safe point, which training and evaluation reach often.
``python -m hf_grpo.train`` handles them from its first line, before torch loads, and a launched one dies with the
process that started it. Reward workers starting while a run stops leave without a traceback.

    .venv/bin/python -m pytest -q tests/test_stopping.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_grpo.base import stopping
from hf_grpo.base.stopping import StopSignal, handle_stop_signals
from hf_grpo.evaluation.core import generate
from hf_grpo.training.trainer import GRPOTrainer

from .helpers.common import REPO, run_module
from .helpers.launching import RUN_MARK, kill_marked, loads_torch, wait_until
from .scripts.stop_inside_exec import wait_for_the_handler


def stop_status(*argv: str) -> tuple[int, str]:
    """Exit status and stderr of ``python -m tests.scripts.stop_inside_exec ARGV``."""
    done = run_module("tests.scripts.stop_inside_exec", *argv)
    return done.returncode, done.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_landing_inside_an_exec_still_exits_130(signame):
    """A SIGTERM that landed while an import built a dataclass (an ``exec`` of a string) made ``python -m
    hf_grpo.train`` print its stop line, return 130, and then die by SIGINT (-2): CPython marks a plain
    KeyboardInterrupt that leaves an exec as unhandled. The handlers raise ``StopSignal``, which it does not mark."""
    if stop_status(signame, "exec", "--plain")[0] != -signal.SIGINT:
        pytest.skip("this CPython does not end a handled plain KeyboardInterrupt from an exec by SIGINT")
    assert stop_status(signame, "exec") == (130, "")


@pytest.mark.subprocess
@pytest.mark.parametrize("where", ["callback", "bare-except"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_that_python_or_a_library_dropped_is_raised_at_the_next_safe_point(signame, where):
    """A SIGTERM that landed in a module lock's weakref callback during an import ("Exception ignored") or in
    datasets' bare ``except:`` while it hashed a transform was dropped, and the run trained on. The next safe point
    now raises it, with nothing printed."""
    status, stderr = stop_status(signame, where, "--plain")
    assert (status, "Exception ignored" in stderr) == (0, where == "callback"), stderr  # the control: lost
    assert stop_status(signame, where) == (130, "")


@pytest.fixture
def dropped_stop():
    """As after a SIGTERM that a library dropped: received, not raised. The handlers are put back after the test."""
    restore = handle_stop_signals()
    stopping._received.append(signal.SIGTERM)
    yield
    restore()


def test_each_training_phase_starts_at_a_safe_point(dropped_stop):
    """Generation, rewards and scoring each run through ``GRPOTrainer._timed``: a dropped stop ends the step there,
    before the phase's work."""
    ran = []
    with pytest.raises(StopSignal, match="signal 15"):
        GRPOTrainer._timed(SimpleNamespace(), "generate", ran.append, "work")
    assert ran == []


def test_each_evaluation_batch_starts_at_a_safe_point(dropped_stop):
    """The held-out evaluation (4,000 problems before training, say) stops at its next batch, before generating."""
    model = SimpleNamespace(training=False, eval=lambda: None, parameters=lambda: iter([torch.zeros(1)]))
    with pytest.raises(StopSignal):
        generate(model, tokenizer=None, prompts=["1+1="], max_new_tokens=4)  # tokenizer=None: never reached


def test_a_second_signal_does_not_interrupt_the_stop():
    """torchrun's agent forwards the launcher's SIGINT to training processes that received it already: raised again,
    it would land in the stop's cleanup (the except clause here) and end the run with a traceback."""
    restore = handle_stop_signals()
    try:
        with pytest.raises(StopSignal):
            os.kill(os.getpid(), signal.SIGINT)
            wait_for_the_handler()
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the agent's copy, during the cleanup
            wait_for_the_handler()
        except KeyboardInterrupt:
            pytest.fail("the second signal was raised in the cleanup")
        assert stopping._received == [signal.SIGINT, signal.SIGINT]
        with pytest.raises(StopSignal):  # a safe point still stops
            stopping.raise_if_stopped()
    finally:
        restore()


def test_restore_forgets_the_stop_and_puts_the_handlers_back():
    names = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(signum) for signum in names], sys.unraisablehook
    restore = handle_stop_signals()
    assert [signal.getsignal(signum) for signum in names] == [stopping.raise_stop] * 3  # SIGHUP: a closed terminal
    stopping._received.append(signal.SIGINT)
    restore()
    assert ([signal.getsignal(signum) for signum in names], sys.unraisablehook) == before
    stopping.raise_if_stopped()  # nothing pending: no raise


@pytest.mark.parametrize(
    ("orig_argv", "argv", "expected"),
    [  # argv: as Python sets sys.argv while it locates a -m module (and imports its package)
        (["/v/bin/python", "-u", "-m", "hf_grpo.train", "recipes/tiny.yaml"], ["-m", "recipes/tiny.yaml"], True),
        (["python", "-W", "ignore", "-m", "hf_grpo.train"], ["-m"], True),
        (
            ["python", "-m", "hf_grpo.base.crash_log", "out", "accelerate", "launch", "-m", "hf_grpo.train"],
            ["-m"],
            False,
        ),
        (["python", "script.py", "-m", "hf_grpo.train"], ["script.py", "-m", "hf_grpo.train"], False),
        (["/v/bin/pytest", "tests/test_stopping.py"], ["/v/bin/pytest", "tests/test_stopping.py"], False),
    ],
)
def test_the_guard_is_for_the_training_command_only(orig_argv, argv, expected):
    assert stopping.training_command(orig_argv, argv) is expected


# ---------------------------------------------------------------------------------------------------------------------
# Reward workers while a run stops


def test_a_worker_starting_after_its_pool_closed_leaves_without_a_traceback():
    """A stop signal while the pool started its workers: the parent closed their pipes, and a worker saying "ready"
    printed a BrokenPipeError traceback under the run's one stop line. It now leaves quietly (a subprocess: a worker
    takes a process group of its own)."""
    code = (
        "import multiprocessing; from hf_grpo.base.workers import _worker_main; "
        "parent, child = multiprocessing.Pipe(); parent.close(); _worker_main(child, [], None)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")


FORK_SERVER_MASK = """
import multiprocessing.forkserver, signal
from pathlib import Path
from hf_grpo.base.workers import WorkerPool

with WorkerPool(num_workers=1):
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    blocked = [line for line in Path(f"/proc/{server}/status").read_text().splitlines() if line.startswith("SigBlk")]
    print(int(blocked[0].split()[1], 16) >> (signal.SIGINT - 1) & 1, signal.SIGINT in signal.pthread_sigmask(0, []))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the fork server's signal mask in /proc")
def test_the_fork_server_starts_with_sigint_held():
    """Ctrl-C (the launcher's SIGINT to a launch's process group) while a training process started its reward
    workers' fork server killed the server mid-initialization: "Fatal Python error: init_sys_streams" and a
    KeyboardInterrupt traceback under the stop line. The server now starts with SIGINT blocked (it ignores SIGINT
    once running); the caller's mask is as before."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_SERVER_MASK], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.stdout.split() == ["1", "False"], done.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------------
# The start of `python -m hf_grpo.train`, before torch loads


def caught_signals(pid: int) -> set[int]:
    """The signals process ``pid`` has a handler for (``SigCgt`` in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt")), 16)
    return {signum for signum in range(1, 65) if mask >> (signum - 1) & 1}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


START_ARGS = ["recipes/tiny.yaml", "--report_to", "none", "--max_steps", "500", "--eval_before_after", "false"]


@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="watches the process start in /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stop_while_the_training_command_starts_ends_with_one_line_and_130(signame, tmp_path):
    """SIGTERM while `python -m hf_grpo.train` imported torch or checked the recipe killed it silently (143), SIGHUP
    (a closed terminal) too, and SIGINT printed a KeyboardInterrupt traceback. Its stop handlers are now in place
    before torch loads, and a stop there ends it with one line and status 130."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_grpo.train", *START_ARGS, "--output_dir", str(out)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: proc.poll() is not None or loads_torch(proc.pid), 120)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= caught_signals(proc.pid)  # before torch loads
        proc.send_signal(signal.Signals[signame])
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.count("\n") == 1, err[-3000:]
    assert err.startswith("hf_grpo: stopped by a signal while starting") and err.rstrip().endswith(
        "--resume_from_checkpoint auto"
    ), err
    assert not (out / "hf_grpo.lock").exists()


ORPHANING_PARENT = """
import os, subprocess, sys, time
env = {**os.environ, "HF_GRPO_LAUNCHED": "1", "HF_GRPO_LAUNCH_PID": str(os.getpid())}
with open(sys.argv[2], "w") as err:
    child = subprocess.Popen(
        [sys.executable, "-m", "hf_grpo.train", *sys.argv[3:]], env=env, stdout=subprocess.DEVNULL, stderr=err
    )
print(child.pid, flush=True)
while sys.argv[1] == "once-torch-loads" and child.poll() is None:
    if "libtorch" in open(f"/proc/{child.pid}/maps").read():
        break
    time.sleep(0.05)
"""  # then it exits, as `accelerate launch` does on SIGTERM, leaving its training process to init


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("when", ["at-once", "once-torch-loads"])
def test_a_launched_training_process_dies_with_its_parent_while_it_starts(when, tmp_path):
    """`accelerate launch` killed in its training process's first seconds orphaned it: its parent-death signal was
    set only after the imports and the recipe's checks, and it trained on alone. It is now set first thing, and a
    parent that died even before that (``at-once``) is noticed: the process that launched it named itself."""
    mark, out, err = f"orphan-{os.getpid()}-{when}-{time.monotonic_ns()}", tmp_path / "run", tmp_path / "err.txt"
    try:
        parent = subprocess.run(
            [sys.executable, "-c", ORPHANING_PARENT, when, str(err), *START_ARGS, "--output_dir", str(out)],
            cwd=REPO, env={**os.environ, RUN_MARK: mark}, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        child = int(parent.stdout)
        assert wait_until(lambda: not alive(child) or (out / "hf_grpo.lock").exists(), 300), err.read_text()[-3000:]
        assert not alive(child) and not (out / "hf_grpo.lock").exists(), err.read_text()[-3000:]
    finally:
        kill_marked(mark)
    assert err.read_text() == ""  # stopped quietly: a launcher, were it alive, would say so


# A training process whose run ended (here: returned) and whose launch sends it SIGTERM just as it puts its signal
# handlers back (as accelerate's agent stops the other ranks once one failed): argv is the output_dir.
SIGTERM_AT_THE_END = """
import os, signal, sys

import hf_grpo.train as train

real = train.stop_like_ctrl_c


def stop_like_ctrl_c():
    restore = real()

    def outcome_decided():
        os.kill(os.getpid(), signal.SIGTERM)  # delivered as the handlers change
        restore()

    return outcome_decided


train.stop_like_ctrl_c, train.run = stop_like_ctrl_c, lambda recipe: None
sys.exit(train.main(["tiny", "--output_dir", sys.argv[1]]))
"""


def test_sigterm_while_a_training_process_puts_its_handlers_back_just_ends_it(tmp_path):
    """Seen under load: rank 0's run had ended (its peer failed) when the launch's SIGTERM landed in ``main``'s
    ``finally``, raising StopSignal there with a second traceback. The signal waits while the handlers change, then
    ends the process as the default SIGTERM does: no traceback."""
    env = {**os.environ, "HF_GRPO_LAUNCHED": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", SIGTERM_AT_THE_END, str(tmp_path / "run")], check=False, cwd=REPO, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == -signal.SIGTERM, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
