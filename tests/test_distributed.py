"""Scripts run on 2 gloo processes (accelerate_configs/cpu.yaml): the ranks agree on kept groups and parameters,
keep_top_k deletes only after every rank saved, carried groups stay bounded when one rank keeps none.

DeepSpeed ZeRO-2 with CPU optimizer offload on 2 processes runs in tests/test_miniatures.py, as the 8 GB recipe
(``qwen1.5b-gsm8k-8gb.yaml``, ``accelerate_configs/zero2_offload.yaml``) in miniature."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .helpers.common import REPO


pytestmark = pytest.mark.distributed


def launch_cpu_module(module: str, *args) -> subprocess.CompletedProcess:
    """``accelerate launch`` with accelerate_configs/cpu.yaml (2 gloo processes) of ``python -m module args``."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "accelerate_configs/cpu.yaml"),
        "-m",
        module,
        *map(str, args),
    ]
    return subprocess.run(
        cmd,
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_two_processes_agree_on_kept_groups_and_parameters(tmp_path):
    out = tmp_path / "ranks.json"
    result = launch_cpu_module("tests.scripts.distributed_check", out)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = json.loads(out.read_text())
    assert [r["rank"] for r in reports] == [0, 1] and reports[0]["world_size"] == 2
    assert reports[0]["keep_digest"] == reports[1]["keep_digest"], "processes disagree on the kept groups"
    assert reports[0]["params"] == reports[1]["params"], "parameters diverged between processes"
    assert max(reports[0]["rounds"]) > 1, "the scripted reward should have forced extra generation rounds"


def test_keep_top_k_deletes_only_after_every_rank_has_saved(tmp_path):
    """Rank 0 deleted a low-ranked checkpoint while a slower rank was still writing into it, which
    re-created ``checkpoint-N`` with that rank's files only; ``resume_from_checkpoint: auto`` then picked it."""
    out = tmp_path / "topk"
    result = launch_cpu_module("tests.scripts.keep_top_k_check", out)
    assert result.returncode == 0, result.stderr[-4000:]
    # the best (accuracy 1/step) and the newest, kept to resume from whatever its rank
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-3"]
    scores = json.loads((out / "checkpoint_scores.json").read_text())
    assert scores == {"checkpoint-1": 1.0, "checkpoint-3": pytest.approx(1 / 3)}
    for name in scores:  # checkpoint-2 was deleted only once both ranks had written into it: not re-created
        files = {p.name for p in (out / name).iterdir()}
        assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= files, (name, files)


def test_carried_groups_stay_within_one_step_when_one_process_never_keeps_any(tmp_path):
    """The rounds run until the process with the fewest kept groups has enough, so a process that keeps
    everything carried its surplus from step to step (4, 8, 12 groups here). Now each process carries at most one
    step's worth (2 groups) and trains on nothing generated more than one step earlier."""
    out = tmp_path / "ranks.json"
    result = launch_cpu_module("tests.scripts.carry_bound_check", out)
    assert result.returncode == 0, result.stderr[-4000:]
    rank0, rank1 = json.loads(out.read_text())
    assert len(rank0["pool_sizes"]) == 4, rank0
    assert max(rank0["pool_sizes"]) <= 2 and max(rank1["pool_sizes"]) == 0, (rank0, rank1)
    assert rank0["ages"] and max(rank0["ages"]) <= 1, rank0["ages"]
    assert 1 in rank0["ages"], "rank 0 should have trained on groups carried from the step before"


@pytest.mark.slow
def test_processes_resume_from_the_same_checkpoint_or_all_stop_with_one_line(tmp_path):
    """Nodes without a shared output_dir each find their own newest checkpoint (node 1 often none); a run whose
    ranks resumed from different steps paired the wrong collectives. Now every process gets the same answer."""
    out = tmp_path / "outcomes.json"
    result = launch_cpu_module("tests.scripts.resume_agreement_check", out, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = json.loads(out.read_text())
    assert len(ranks) == 2 and ranks[0] == ranks[1], ranks  # every process: the same outcome
    outcome = ranks[0]
    assert outcome["same"] == {"resume": "out/checkpoint-4"}
    assert outcome["none_anywhere"] == {"resume": None}
    for case, node_1 in (("none_on_node_1", "none"), ("older_on_node_1", "checkpoint-2")):
        error = outcome[case]["error"]
        assert "process 0 on" in error and "checkpoint-4" in error and "process 1 on" in error, error
        assert node_1 in error and "shares" in error and "\n" not in error
    assert outcome["problem_on_node_1"]["error"].startswith("process 1 (on ")
    assert "no manifest" in outcome["problem_on_node_1"]["error"]
