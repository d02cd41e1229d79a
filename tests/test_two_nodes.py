"""Two real nodes on one host: two network namespaces (10.77.0.1 and 10.77.0.2 over a veth pair, created here and
torn down after; root only), each starting its share of the tiny recipe with the one command README shows,
``python -m hf_grpo.train RECIPE --machine_rank R --main_process_ip 10.77.0.1``, over gloo between them. Checked:
training to the end with a shared output_dir and resuming there, and a resume where each node has its own output_dir (no shared disk),
which must stop on both nodes with the same one line instead of resuming them from different steps. Tier 2:

    sudo .venv/bin/python -m pytest -q --tier 2 tests/test_two_nodes.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from hf_grpo.checkpoints import MANIFEST

from .helpers.common import REPO
from .test_generation import COMMON, RUN_MARK, free_port, kill_marked, wait_until


pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
MAIN = "10.77.0.1"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def nodes():
    """Two namespaces joined by a veth pair: [(namespace, interface), ...] for node 0 and node 1."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    made = [(f"hfg{tag}n{i}", f"hfg{tag}v{i}") for i in range(2)]
    try:
        for ns, _ in made:
            if _ip("netns", "add", ns).returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {_ip('netns', 'add', ns).stderr.strip()}")
        steps = [["link", "add", made[0][1], "type", "veth", "peer", "name", made[1][1]]]
        for i, (ns, dev) in enumerate(made):
            steps += [["link", "set", dev, "netns", ns], ["-n", ns, "addr", "add", f"10.77.0.{i + 1}/24", "dev", dev]]
            steps += [["-n", ns, "link", "set", dev, "up"], ["-n", ns, "link", "set", "lo", "up"]]
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield made
    finally:
        for ns, _ in made:
            _ip("netns", "del", ns)  # takes its end of the veth pair with it


def start(node, rank: int, out, port: int, mark: str, *extra: str) -> subprocess.Popen:
    """Node ``rank``'s command in its namespace; its processes carry ``RUN_MARK=mark-rank``."""
    ns, dev = node
    argv = [
        "ip", "netns", "exec", ns, sys.executable, "-m", "hf_grpo.train", *COMMON, "--max_steps", "2",
        "--save_strategy", "steps", "--save_steps", "1", "--eval_before_after", "false", "--task_eval_steps", "0",
        "--report_to", "none", "--per_device_train_batch_size", "8", "--accelerate_config", "cpu",
        "--num_machines", "2", "--num_processes", "2", "--output_dir", str(out),
        "--machine_rank", str(rank), "--main_process_ip", MAIN, "--main_process_port", str(port), *extra,
    ]  # fmt: skip
    env = {**os.environ, RUN_MARK: f"{mark}-{rank}", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": dev}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def both(nodes, outs, mark: str, *extra: str) -> list[tuple[int, str]]:
    """Start node 0 and node 1 at once; (exit status, stderr) of each, node 0 first."""
    port = free_port()
    runs = [start(node, rank, outs[rank], port, mark, *extra) for rank, node in enumerate(nodes)]
    return [(run.wait(timeout=600), run.stderr.read()) for run in runs]


@pytest.mark.timeout(1500)
def test_two_nodes_train_then_refuse_a_resume_without_a_shared_output_dir(nodes, tmp_path):
    mark = f"nodes-{os.getpid()}-{time.monotonic_ns()}"
    shared = tmp_path / "shared"
    try:
        results = both(nodes, [shared, shared], mark)
        for rank, (code, err) in enumerate(results):
            assert code == 0, f"node {rank}: {err[-3000:]}"
        assert (shared / "checkpoint-2").is_dir() and (shared / "adapter_model.safetensors").is_file()
        results = both(nodes, [shared, shared], mark, "--max_steps", "3", "--resume_from_checkpoint", "auto")
        for rank, (code, err) in enumerate(results):  # node 1 neither refuses on node 0's lock nor resumes alone
            assert code == 0, f"node {rank}: {err[-3000:]}"
        assert (shared / "checkpoint-3" / MANIFEST).is_file()
        assert "resuming from" in results[0][1] and str(shared / "checkpoint-2") in results[0][1]

        own = [tmp_path / "node0", tmp_path / "node1"]
        results = both(nodes, own, mark)  # each node its own output_dir: only node 0's holds checkpoints
        assert [code for code, _ in results] == [0, 0], [err[-2000:] for _, err in results]
        # node 1 holds only its own fragments of each checkpoint (rank 1's RNG and sampling state), never complete
        assert (own[0] / "checkpoint-2" / MANIFEST).is_file() and not (own[1] / "checkpoint-2" / MANIFEST).exists()
        started = time.monotonic()
        results = both(nodes, own, mark, "--max_steps", "3", "--resume_from_checkpoint", "auto")
        took = time.monotonic() - started
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")
    for rank, (code, err) in enumerate(results):  # node 1 found only fragments: both stop, naming it and the fix
        assert code != 0, f"node {rank} resumed: {err[-3000:]}"
        lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error: process 1 (on ")]
        assert len(lines) == 1, f"node {rank}: {err[-3000:]}"
        assert "node1" in lines[0] and "none can be resumed" in lines[0] and "filesystem they all share" in lines[0]
    print(f"resume refused on both nodes in {took:.0f} s")


@pytest.mark.timeout(900)
def test_a_killed_node_ends_the_other_with_one_line(nodes, tmp_path):
    """Node 1 SIGKILLed mid-run (its launcher and training process): node 0 ends on its own, soon, saying in one
    ``hf_grpo: error:`` line that it lost a peer, instead of a bare echo of the collective's error."""
    mark, out = f"killed-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "shared"
    port = free_port()
    runs = [start(node, rank, out, port, mark, "--max_steps", "500") for rank, node in enumerate(nodes)]
    try:
        history = out / "training_history.json"
        assert wait_until(lambda: history.is_file() or any(r.poll() is not None for r in runs), 300)
        assert all(r.poll() is None for r in runs), [r.stderr.read()[-2000:] for r in runs if r.poll() is not None]
        kill_marked(f"{mark}-1")
        killed = time.monotonic()
        code = runs[0].wait(timeout=300)  # bounded by gloo seeing the closed connection, not by a guessed time
        took = time.monotonic() - killed
        err = runs[0].stderr.read()
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")
    assert code != 0, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error: lost contact")]
    assert len(lines) == 1, err[-4000:]
    assert "resume with: " in lines[0] and "--machine_rank 0" in lines[0], lines[0]
    assert "Traceback" not in err and " by peer" in lines[0], err[-4000:]  # gloo: reset or closed by peer
    print(f"node 0 ended {took:.1f} s after node 1 was killed")
