"""Several machines: each node starts its own share with one command, named by a rank and the main node's address
(``--machine_rank``/``--main_process_ip``, or ``$NODE_RANK``/``$MASTER_ADDR`` as schedulers set them). Checked on the
shipped 2-node recipe and its miniature, without training; the runs are in tests/test_miniatures.py. And one machine:
each run on a port of its own."""

from __future__ import annotations

import socket

import pytest
import torch

from hf_grpo.launch.launcher import MAIN_NODE_PLACEHOLDER, node_commands, plan_commands
from hf_grpo.launch.processes import loopback_host_problem
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main
from hf_grpo.training.checkpoints import listing, problem, write_manifest


RECIPE = "recipes/qwen7b-lora-2node.yaml"
NODE_ENV = ("NODE_RANK", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_scheduler_env(monkeypatch):
    for name in NODE_ENV:
        monkeypatch.delenv(name, raising=False)


def launches(recipe, argv) -> list[str]:
    return [" ".join(c.argv) for c in plan_commands(recipe, argv) if c.role == "train"]


def test_a_run_on_several_machines_refuses_before_loading_until_the_node_is_named():
    with pytest.raises(RecipeError) as caught:
        load_recipe([RECIPE], for_run=True)
    message = str(caught.value)
    assert "--machine_rank" in message and "--main_process_ip" in message and "$NODE_RANK" in message
    assert "2 machines" in message and RECIPE in message


@pytest.mark.parametrize("source", ["command line", "environment"])
def test_a_named_node_launches_only_its_own_share(source, monkeypatch):
    argv = [RECIPE]
    if source == "command line":
        argv += ["--machine_rank", "1", "--main_process_ip", "10.77.0.1", "--main_process_port", "29600"]
    else:
        monkeypatch.setenv("NODE_RANK", "1")
        monkeypatch.setenv("MASTER_ADDR", "10.77.0.1")
        monkeypatch.setenv("MASTER_PORT", "29600")
    recipe, _ = load_recipe(argv, for_run=False)
    (launch,) = launches(recipe, argv)
    assert "--machine_rank 1" in launch and "--main_process_ip 10.77.0.1" in launch
    assert "--main_process_port 29600" in launch and "--num_machines 2" in launch
    assert "this is machine 1, the main one at 10.77.0.1" in recipe.layout.describe()


def test_slurm_node_id_names_the_rank(monkeypatch):
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.77.0.1")
    recipe, _ = load_recipe([RECIPE], for_run=False)
    assert recipe.layout.machine_rank == 1


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--machine_rank", "2", "--main_process_ip", "10.77.0.1"], {}, "machine_rank is 2"),
        ([], {"NODE_RANK": "one", "MASTER_ADDR": "10.77.0.1"}, "$NODE_RANK is 'one'"),
        ([], {"NODE_RANK": "1", "MASTER_ADDR": "10.77.0.1", "MASTER_PORT": "x"}, "$MASTER_PORT is 'x'"),
    ],
)
def test_a_bad_rank_or_port_is_one_line_naming_it(argv, env, named, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([RECIPE, *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf_grpo: error:") and named in err and "\n" not in err


def test_dry_run_prints_each_nodes_command(capsys):
    assert main([RECIPE, "--dry-run"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("on separate machines") :].splitlines()[1:3]
    for rank, line in enumerate(section):
        assert "-m hf_grpo.train recipes/qwen7b-lora-2node.yaml" in line
        assert f"--machine_rank {rank} --main_process_ip {MAIN_NODE_PLACEHOLDER}" in line
    recipe, _ = load_recipe([RECIPE, "--machine_rank", "0", "--main_process_ip", "10.77.0.1"], for_run=False)
    assert node_commands(recipe, [RECIPE]) == []  # a named node needs no list


def test_a_miniature_simulates_every_node_here_unless_one_is_named():
    argv = [RECIPE, "--miniature"]
    recipe, _ = load_recipe(argv, for_run=False)
    both = launches(recipe, argv)
    assert [("--machine_rank 0" in c, "--machine_rank 1" in c) for c in both] == [(True, False), (False, True)]
    assert all("--main_process_ip 127.0.0.1" in c for c in both)
    named = [*argv, "--machine_rank", "1", "--main_process_ip", "10.77.0.1"]
    recipe, _ = load_recipe(named, for_run=False)
    (one,) = launches(recipe, named)
    assert "--machine_rank 1" in one and "--main_process_ip 10.77.0.1" in one


NODE_ARGS = ["--machine_rank", "1", "--main_process_ip", "10.77.0.1"]


def resolving(monkeypatch, table: dict[str, str]) -> None:
    """This machine is called ``node-b``; ``table`` says what each name resolves to (others do not resolve)."""

    def gethostbyname(name):
        if name in table:
            return table[name]
        raise OSError(f"unknown host {name}")

    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    monkeypatch.setattr(socket, "gethostbyname", gethostbyname)


def test_a_hostname_on_loopback_stops_a_cpu_node_before_loading_naming_gloo_socket_ifname(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # gloo carries the collectives
    resolving(monkeypatch, {"node-b": "127.0.1.1", "10.77.0.1": "10.77.0.1"})
    with pytest.raises(RecipeError) as caught:
        load_recipe([RECIPE, *NODE_ARGS], for_run=True)
    message = str(caught.value)
    assert "'node-b' resolves to a loopback address" in message and "GLOO_SOCKET_IFNAME=" in message, message
    assert "/etc/hosts" in message and RECIPE in message

    load_recipe([RECIPE, *NODE_ARGS], for_run=False)  # a dry run only prints the commands


@pytest.mark.parametrize(
    "case", ["interface named", "hostname on the network", "main node is this host", "NCCL (a GPU machine)"]
)
def test_a_hostname_on_loopback_is_no_problem_when_gloo_is_told_or_unused(case, monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: case == "NCCL (a GPU machine)")
    table = {"node-b": "127.0.1.1", "10.77.0.1": "10.77.0.1", "localhost": "127.0.0.1"}
    argv = [RECIPE, *NODE_ARGS]
    if case == "interface named":
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    elif case == "hostname on the network":
        table["node-b"] = "10.77.0.2"
    elif case == "main node is this host":
        argv = [RECIPE, "--machine_rank", "1", "--main_process_ip", "localhost"]
    resolving(monkeypatch, table)
    recipe, _ = load_recipe(argv, for_run=False)
    assert loopback_host_problem(recipe.layout, gloo=case != "NCCL (a GPU machine)") is None


def test_the_manifest_lists_every_process_files_so_a_node_without_them_does_not_resume(tmp_path):
    """Nodes that do not share output_dir: each writes its checkpoint's manifest from what every process saw, so on
    each node the files written only on the other are missing and the checkpoint is incomplete (where one node's own
    listing would have looked complete)."""
    node0, node1 = tmp_path / "node0" / "checkpoint-2", tmp_path / "node1" / "checkpoint-2"
    for folder, files in ((node0, ["model.safetensors", "rng_state_0.pth"]), (node1, ["rng_state_1.pth"])):
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_bytes(b"x" * 8)
    seen = [listing(node0), listing(node1)]  # process 0 on node 0, process 1 on node 1 (gathered in the trainer)
    for folder in (node0, node1):
        write_manifest(folder, 2, True, seen)
    assert problem(node0, 2) == f"{node0 / 'rng_state_1.pth'} is missing"
    assert problem(node1, 2) == f"{node1 / 'model.safetensors'} is missing"
    write_manifest(node0, 2, True)  # what only this node saw: complete-looking, the old behaviour
    assert problem(node0, 2) is None
    (node0 / "rng_state_1.pth").write_bytes(b"x" * 8)  # a shared folder holds every process's files
    write_manifest(node0, 2, True, seen)
    assert problem(node0, 2) is None


def test_runs_side_by_side_on_one_machine_each_get_a_free_port_unless_one_is_named(monkeypatch):
    """accelerate's default port is always 29500: two 2-process runs started at once on one machine collided there
    (one exited 'main_process_port 29500 is taken'). Each launch now asks accelerate for a free port on 127.0.0.1
    (port 0), and a port the user names (command line, $MASTER_PORT) is the one used."""
    argv = ["recipes/tiny.yaml", "--accelerate_config", "cpu", "--num_processes", "2"]
    recipe, _ = load_recipe(argv, for_run=False)
    (launch,) = launches(recipe, argv)
    assert "--main_process_ip 127.0.0.1 --main_process_port " in launch, launch
    assert "--main_process_port 0 " in launch  # accelerate takes a free one as it starts
    named = [*argv, "--main_process_port", "29611"]
    assert "--main_process_port 29611" in launches(load_recipe(named, for_run=False)[0], named)[0]
    monkeypatch.setenv("MASTER_PORT", "29612")
    assert "--main_process_port 29612" in launches(load_recipe(argv, for_run=False)[0], argv)[0]
