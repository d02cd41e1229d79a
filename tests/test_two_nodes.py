"""Two real nodes on one host: two network namespaces (10.77.0.1 and 10.77.0.2 over a veth pair, created here and
torn down after; root only), each starting its share with the one command README shows,
``python -m hf_grpo.train RECIPE --machine_rank R --main_process_ip 10.77.0.1``, over gloo between them. In each
namespace the hostname resolves to a loopback address (``/etc/netns/NS/hosts``, as Debian's ``127.0.1.1``), so the runs
name the interface with ``GLOO_SOCKET_IFNAME`` as README says. Checked: without ``GLOO_SOCKET_IFNAME`` both stop
before any collective, naming it; the tiny recipe trains with a shared output_dir, a killed main node ends the other
in one line, and both resume there over its stale lock and train to the end; a node that stops answering ends the
other after ``ddp_timeout``; the 2-node miniature (DeepSpeed over gloo) trains with a cold model cache and an
output_dir on each node (no shared disk), and a resume then stops on both nodes with the same one line.
Tier 2:

    sudo .venv/bin/python -m pytest -q --tier 2 tests/test_two_nodes.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hf_grpo.training.checkpoints import MANIFEST, newest_complete, problem

from .helpers.common import REPO
from .helpers.launching import COMMON, RUN_MARK, free_port, kill_marked, marked_processes, wait_until


pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
MAIN = "10.77.0.1"
TINY = [
    *COMMON,
    "--per_device_train_batch_size",
    "8",
    "--accelerate_config",
    "cpu",
    "--num_processes",
    "2",
    "--task_eval_steps",
    "0",
]
SAVE_EVERY_STEP = ["--save_strategy", "steps", "--save_steps", "1", "--eval_before_after", "false"]
MINIATURE = ["recipes/qwen7b-lora-2node.yaml", "--miniature", "--eval_before_after", "false"]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def nodes():
    """Two namespaces joined by a veth pair: [(namespace, interface), ...] for node 0 and node 1."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    made = [(f"hfg{tag}n{i}", f"hfg{tag}v{i}") for i in range(2)]
    etc = [Path("/etc/netns") / ns for ns, _ in made]
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
        for folder in etc:  # `ip netns exec` mounts these over /etc/hosts: the hostname on loopback, as Debian's
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
        yield made
    finally:
        for ns, _ in made:
            _ip("netns", "del", ns)  # takes its end of the veth pair with it
        for folder in etc:
            shutil.rmtree(folder, ignore_errors=True)


def start(node, rank: int, out, port: int, mark: str, *extra: str, recipe=TINY, env=None) -> subprocess.Popen:
    """Node ``rank``'s command in its namespace; its processes carry ``RUN_MARK=mark-rank``. ``env``: more (or,
    as None, fewer) variables than ``GLOO_SOCKET_IFNAME`` set to the node's interface."""
    ns, dev = node
    argv = [
        "ip", "netns", "exec", ns, sys.executable, "-m", "hf_grpo.train", *recipe, "--max_steps", "2",
        "--report_to", "none", "--num_machines", "2", "--output_dir", str(out),
        "--machine_rank", str(rank), "--main_process_ip", MAIN, "--main_process_port", str(port), *extra,
    ]  # fmt: skip
    full = {**os.environ, RUN_MARK: f"{mark}-{rank}", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": dev}
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return subprocess.Popen(argv, cwd=REPO, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def both(nodes, outs, mark: str, *extra: str, **options) -> list[tuple[int, str]]:
    """Start node 0 and node 1 at once; (exit status, stderr) of each, node 0 first."""
    port = free_port()
    runs = [start(node, rank, outs[rank], port, mark, *extra, **options) for rank, node in enumerate(nodes)]
    return finish(runs, 900)


def finish(runs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(exit status, stderr) of each run, read side by side: a node blocked on a full stderr pipe never waits for
    this test to read the other's."""

    def one(run):
        err = run.communicate(timeout=timeout)[1]
        return run.returncode, err

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(one, runs))


def one_error(err: str, starts: str) -> str:
    """The single ``hf_grpo: error:`` line of ``err``, which must start with ``hf_grpo: error: <starts>``."""
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(lines) == 1 and lines[0].startswith(f"hf_grpo: error: {starts}"), err[-4000:]
    return lines[0]


def test_a_hostname_on_loopback_stops_both_nodes_before_any_collective_naming_the_fix(nodes, tmp_path):
    mark = f"loopback-{os.getpid()}-{time.monotonic_ns()}"
    try:
        results = both(nodes, [tmp_path, tmp_path], mark, env={"GLOO_SOCKET_IFNAME": None})
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")
    for code, err in results:
        assert code != 0, err[-3000:]
        line = one_error(err, "recipes/tiny.yaml")
        assert "resolves to a loopback address" in line and "GLOO_SOCKET_IFNAME=" in line, line
        assert "Traceback" not in err, err[-3000:]


@pytest.mark.timeout(1500)
def test_a_killed_main_node_ends_the_other_in_one_line_and_both_resume_over_its_lock_to_the_end(nodes, tmp_path):
    """Two nodes train into a shared output_dir, saving every step; node 0 SIGKILLed mid-run (launcher and training
    process; its lock stays in the shared output_dir): node 1 ends on its own, saying in one line that it lost a
    peer; then both resume from the newest complete checkpoint (node 1 neither refuses on node 0's lock nor resumes
    alone) and train to the end, writing the final adapter and a checkpoint complete with both nodes' files."""
    mark, out = f"killed-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "shared"
    port = free_port()
    runs = [start(node, r, out, port, mark, *SAVE_EVERY_STEP, "--max_steps", "500") for r, node in enumerate(nodes)]
    try:
        assert wait_until(
            lambda: newest_complete(out, 2)[0] is not None or any(r.poll() is not None for r in runs), 600
        )
        assert all(r.poll() is None for r in runs), [r.stderr.read()[-2000:] for r in runs if r.poll() is not None]
        kill_marked(f"{mark}-0")
        code = runs[1].wait(timeout=600)  # bounded by gloo seeing the closed connection, not by a guessed time
        err = runs[1].stderr.read()
        assert code != 0, err[-3000:]
        line = one_error(err, "lost contact")
        assert "resume with: " in line and "--machine_rank 1" in line and "Traceback" not in err, err[-4000:]
        assert (out / "hf_grpo.lock").is_file()  # node 0's, left by the kill
        saved, _ = newest_complete(out, 2)
        step = int(saved.name.split("-")[1])
        resumed = both(
            nodes, [out, out], mark, *SAVE_EVERY_STEP, "--max_steps", str(step + 1), "--resume_from_checkpoint", "auto"
        )
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")
    for rank, (code, err) in enumerate(resumed):
        assert code == 0, f"node {rank}: {err[-3000:]}"
    assert f"resuming from {saved}" in resumed[0][1]
    assert newest_complete(out, 2)[0] == out / f"checkpoint-{step + 1}"  # both nodes' files, in the shared folder
    assert (out / "adapter_model.safetensors").is_file() and not (out / "hf_grpo.lock").exists()


@pytest.mark.timeout(900)
def test_a_node_that_stops_answering_ends_the_other_after_ddp_timeout(nodes, tmp_path):
    """Node 1 frozen (SIGSTOP: its connections stay open, as a machine whose link went down): node 0 waits
    ``ddp_timeout`` in its next collective, not transformers' 30 minutes, then ends with one line. The collectives
    before (process group, sharded evaluation: off here) wait on the other node's start, on the same host."""
    mark, out, timeout = f"stopped-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "shared", 30
    port = free_port()
    extra = ["--max_steps", "500", "--ddp_timeout", str(timeout), "--eval_before_after", "false"]
    runs = [start(node, rank, out, port, mark, *extra) for rank, node in enumerate(nodes)]
    history = out / "training_history.json"
    try:
        assert wait_until(lambda: history.is_file() or any(r.poll() is not None for r in runs), 600)
        assert all(r.poll() is None for r in runs), [r.stderr.read()[-2000:] for r in runs if r.poll() is not None]
        for pid in marked_processes(f"{mark}-1"):
            os.kill(pid, signal.SIGSTOP)
        code = runs[0].wait(timeout=600)
        err = runs[0].stderr.read()
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")  # SIGKILL ends stopped processes too
    assert code != 0, err[-3000:]
    line = one_error(err, "lost contact")
    assert f"Timed out waiting {timeout * 1000}ms" in line and "hung" in line, line  # gloo used ddp_timeout


@pytest.mark.timeout(2400)
def test_the_two_node_miniature_trains_with_a_cold_cache_and_an_output_dir_per_node_and_refuses_a_resume(
    nodes, tmp_path
):
    """The 2-node miniature (DeepSpeed ZeRO over gloo) with nothing shared: each node builds the miniature's model
    into its own empty cache (node 1's processes are not global rank 0) and writes its own output_dir, which holds
    only its own processes' checkpoint files while each manifest lists both nodes': neither is complete. A resume then
    needs files from both nodes, so each finds only its own and both stop with the same one line instead of
    DeepSpeed failing on node 1."""
    mark = f"mini-{os.getpid()}-{time.monotonic_ns()}"
    own = [tmp_path / "node0", tmp_path / "node1"]
    env = [{"HF_GRPO_CACHE": str(tmp_path / f"cache{r}")} for r in (0, 1)]
    try:
        port = free_port()
        runs = [start(node, r, own[r], port, mark, recipe=MINIATURE, env=env[r]) for r, node in enumerate(nodes)]
        results = finish(runs, 1800)
        for rank, (code, err) in enumerate(results):
            assert code == 0, f"node {rank}: {err[-3000:]}"
        for rank in (0, 1):
            assert list((tmp_path / f"cache{rank}").glob("miniature/*/model/model.safetensors")), rank
            assert (own[rank] / "checkpoint-2" / MANIFEST).is_file()
            assert "is missing" in (problem(own[rank] / "checkpoint-2", 2) or ""), rank
        assert (own[0] / "adapter_model.safetensors").is_file()
        resume = ["--max_steps", "3", "--resume_from_checkpoint", "auto"]
        port = free_port()
        runs = [
            start(node, r, own[r], port, mark, *resume, recipe=MINIATURE, env=env[r]) for r, node in enumerate(nodes)
        ]
        refused = finish(runs, 900)
    finally:
        for rank in (0, 1):
            kill_marked(f"{mark}-{rank}")
    texts = []
    for rank, (code, err) in enumerate(refused):
        assert code != 0, f"node {rank} resumed: {err[-3000:]}"
        line = one_error(err, "process 0 (on ")
        assert "is missing" in line and "none can be resumed" in line and "filesystem they all share" in line, line
        texts.append(line)
    assert texts[0] == texts[1]
