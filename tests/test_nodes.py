"""Several machines: each node starts its own share with one command, named by a rank and the main node's address
(``--machine_rank``/``--main_process_ip``, or ``$NODE_RANK``/``$MASTER_ADDR`` as schedulers set them). Checked on the
shipped 2-node recipe and its miniature, without training; the runs are in tests/test_miniatures.py."""

from __future__ import annotations

import pytest

from hf_grpo.launch import MAIN_NODE_PLACEHOLDER, node_commands, plan_commands
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main


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
