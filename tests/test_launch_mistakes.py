"""Launch mistakes on several machines, each refused before anything launches with exit status 2 and one
``hf_grpo: error:`` line naming the value: a main node address that is not one or does not resolve (torch's
rendezvous retried it in silence for minutes), the main node's port taken (a second node started here as rank 0),
a process count that does not divide among the machines, and far more training processes than this machine has cores.
The addresses are malformed, or in the reserved ``.invalid`` top-level domain (RFC 2606), which never resolves.

    .venv/bin/python -m pytest -q tests/test_launch_mistakes.py              # tier 1
    .venv/bin/python -m pytest -q tests/test_launch_mistakes.py --tier 2     # with two launches of rank 0
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hf_grpo.base.crash_log import taken_port
from hf_grpo.generation.settings import GenerationArguments
from hf_grpo.launch.hardware import Machine, hardware_problems
from hf_grpo.launch.launcher import STOP_GRACE_S
from hf_grpo.launch.processes import Layout, main_port_problem
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main

from .helpers.common import REPO
from .helpers.launching import COMMON, RUN_MARK, kill_marked, marked_processes, wait_until


RECIPE = "recipes/qwen7b-lora-2node.yaml"
NODE_ENV = ("NODE_RANK", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "ACCELERATE_USE_CPU")


@pytest.fixture(autouse=True)
def no_scheduler_env(monkeypatch):
    for name in NODE_ENV:
        monkeypatch.delenv(name, raising=False)


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf_grpo: error:"), err
    return lines[0]


@pytest.mark.parametrize("address", ["999.1.1.1", "not an ip!", "10.0.0", "-node.example", "node..example"])
def test_a_main_process_ip_that_is_not_an_address_exits_2_even_in_a_dry_run(address, capsys):
    assert main([RECIPE, "--machine_rank", "1", "--main_process_ip", address, "--dry-run"]) == 2
    line = one_error(capsys)
    assert f"main_process_ip {address!r} is neither an IP address nor a hostname" in line, line


def test_master_addr_is_named_when_it_is_the_bad_address(monkeypatch, capsys):
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "999.1.1.1")
    assert main([RECIPE, "--dry-run"]) == 2
    assert "$MASTER_ADDR '999.1.1.1' is neither" in one_error(capsys)


@pytest.mark.parametrize("address", ["10.77.0.1", "fd00::1", "node-a", "node-a.cluster.local", "localhost"])
def test_addresses_and_hostnames_pass(address, capsys):
    assert main([RECIPE, "--machine_rank", "1", "--main_process_ip", address, "--dry-run"]) == 0, capsys.readouterr()


def test_a_main_node_name_that_does_not_resolve_stops_a_run_before_anything_loads():
    """A dry run only prints the commands (the cluster's names need not resolve on a laptop); a run stops."""
    argv = [RECIPE, "--machine_rank", "1", "--main_process_ip", "node-a.invalid"]
    load_recipe(argv, for_run=False)
    with pytest.raises(RecipeError) as caught:
        load_recipe(argv, for_run=True)
    assert "main_process_ip 'node-a.invalid' does not resolve on this machine" in str(caught.value)


@pytest.fixture
def held_port():
    """A port something listens on, on every interface of this machine."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_main_nodes_port_taken_stops_it_before_launching_naming_the_port_and_the_rank(held_port):
    argv = [RECIPE, "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", str(held_port)]
    with pytest.raises(RecipeError) as caught:
        load_recipe(argv, for_run=True)
    message = str(caught.value)
    assert f"main_process_port {held_port} is taken on this machine" in message and "machine_rank 0" in message


def test_a_port_bound_but_not_listening_counts_as_taken():
    """What torch's store then fails on (EADDRINUSE), where accelerate's own check (a connect) sees nothing."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        assert "is taken on this machine" in (main_port_problem(sock.getsockname()[1]) or "")
    with socket.socket() as sock:  # free again (a port in TIME_WAIT is free for the store, which reuses it)
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    assert main_port_problem(port) is None


@pytest.mark.parametrize(
    "refusal",
    [
        "Tried to launch distributed communication on port `41234`, but another process is utilizing it. ",  # accelerate
        "The server socket has failed to bind to [::]:41234 (errno: 98 - Address already in use).",  # torch's store
    ],
)
def test_the_taken_port_is_the_one_the_refusal_names_not_the_0_launched_with(refusal):
    """One machine launches with --main_process_port 0 (accelerate picks): the line names the port that was taken."""
    assert taken_port(refusal, ["launch", "--main_process_port", "0"]) == "41234"
    assert taken_port("EADDRINUSE", ["launch", "--main_process_port", "29512"]) == "29512"


@pytest.mark.subprocess
@pytest.mark.parametrize("holder", ["listening", "bound"])
def test_accelerate_finding_the_port_taken_ends_in_one_line(holder, tmp_path):
    """Taken between the launcher's check and accelerate's (two nodes started at once): accelerate's ConnectionError
    (a listener) or torch's EADDRINUSE (a bound port) was a traceback, under a closing line pointing at an
    `hf_grpo: error:` line that was not there. It is now that line, status 2, and the launcher is told."""
    mark = tmp_path / "error-mark"
    mark.write_text("")
    with socket.socket() as sock:
        sock.bind(("", 0))
        if holder == "listening":
            sock.listen()
        port = sock.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable, "-m", "hf_grpo.base.crash_log", str(tmp_path / "run"), "accelerate", "launch",
                "--config_file", "accelerate_configs/cpu.yaml", "--num_processes", "2", "--num_machines", "2",
                "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                "-m", "hf_grpo.train", "recipes/tiny.yaml",
            ],
            cwd=REPO, env={**os.environ, "HF_GRPO_ERROR_MARK": str(mark)}, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(lines) == 1 and f"main_process_port {port} is taken" in lines[0], done.stderr[-3000:]
    assert mark.read_text().strip().isdigit()


@pytest.mark.parametrize(("processes", "machines"), [(3, 2), (1, 2), (10, 4)])
def test_a_process_count_that_does_not_divide_among_the_machines_exits_2_naming_both(processes, machines, capsys):
    argv = ["recipes/tiny.yaml", "--num_processes", str(processes), "--num_machines", str(machines), "--dry-run"]
    assert main(argv) == 2
    line = one_error(capsys)
    assert f"num_processes {processes} does not divide among num_machines {machines}" in line, line


def cpu_layout(processes: int, machines: int = 1) -> Layout:
    return Layout(processes, machines, "MULTI_CPU", None)


def test_far_more_training_processes_than_cores_on_a_cpu_machine():
    cpu = Machine(cuda_devices=0, bf16=False, packages=frozenset(), cpu_cores=2)
    found = hardware_problems({}, {}, cpu_layout(16), GenerationArguments(), cpu)
    assert any("16 training processes on a machine without a GPU and with 2" in p for p in found), found
    assert any("to at most 4" in p for p in found), found
    found = hardware_problems({}, {}, cpu_layout(16, 2), GenerationArguments(), cpu)
    assert any("8 training processes per machine" in p and "all 2 machines together) to at most 8" in p for p in found)
    assert hardware_problems({}, {}, cpu_layout(4), GenerationArguments(), cpu) == []  # 2 per core: a miniature's
    gpus = Machine(cuda_devices=2, bf16=True, packages=frozenset(), cpu_cores=2)  # GPUs: the GPU count limits it
    assert any(
        "need 16 GPUs and this machine has 2" in p
        for p in hardware_problems({}, {}, cpu_layout(16), GenerationArguments(), gpus)
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 16, reason="needs a machine with fewer than 17 cores")
def test_far_more_processes_than_this_machine_has_exits_2_before_launching(capsys):
    """64 training processes on this machine: one line naming the count, before anything starts or loads."""
    argv = ["recipes/tiny.yaml", "--accelerate_config", "cpu", "--num_processes", "64"]
    assert main([*argv, "--per_device_train_batch_size", "2", "--num_generations", "2"]) == 2
    line = one_error(capsys)
    assert "64 training processes on a machine" in line or "need 64 GPUs" in line, line


# ---------------------------------------------------------------------------------------------------------------------
# Two nodes started as rank 0 on this machine (tier 2: real launches)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_node_started_as_rank_0_exits_2_naming_the_port_and_the_first_stops_at_once(tmp_path):
    """The second launch of rank 0 on the first's port: one line, status 2, nothing launched. The first, waiting
    for its other machine in torch's rendezvous (C++, where a Python signal handler never runs), held the launcher's
    stop for its whole grace (60 s) before being killed; it now ends at the stop, with the stop line."""
    mark = f"rank0-{os.getpid()}-{time.monotonic_ns()}"
    port = free_port_here()
    argv = [
        sys.executable, "-m", "hf_grpo.train", *COMMON, "--report_to", "none", "--accelerate_config", "cpu",
        "--num_processes", "2", "--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "127.0.0.1",
        "--main_process_port", str(port),
    ]  # fmt: skip
    env = {**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"}
    first_err = tmp_path / "first.txt"
    with open(first_err, "w") as err:
        first = subprocess.Popen(
            [*argv, "--output_dir", str(tmp_path / "a")], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        assert wait_until(lambda: first.poll() is not None or main_port_problem(port) is not None, 300)
        assert first.poll() is None, first_err.read_text()[-3000:]
        second = subprocess.run(
            [*argv, "--output_dir", str(tmp_path / "b")], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        first.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert first.wait(timeout=120) == 130, first_err.read_text()[-3000:]
        took = time.monotonic() - stopped_at
        assert took < STOP_GRACE_S, f"the stop waited for the grace's SIGKILL ({took:.0f} s)"
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    finally:
        kill_marked(mark)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf_grpo: error:"), second.stderr[-3000:]
    assert f"main_process_port {port} is taken" in lines[0] and "machine_rank 0" in lines[0], lines[0]
    first_lines = [line for line in first_err.read_text().splitlines() if line.startswith("hf_grpo:")]
    assert len(first_lines) == 1 and first_lines[0].startswith("hf_grpo: stopped by a signal"), first_lines
    print(f"the first main node stopped {took:.1f} s after SIGTERM")


def free_port_here() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
