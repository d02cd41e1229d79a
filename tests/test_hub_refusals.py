"""A push that must not happen ends in one line before anything is sent (a folder that is no run of hf_grpo, a run
that has not finished), and a Hub that does not answer ends it in one line after the request timeout. The folders are
small ones ``tests/helpers/fake_hub.write_run`` writes; pushing a real trained run is in test_hub.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from huggingface_hub import constants, get_session
from safetensors.numpy import save_file

from hf_grpo.publish import hub

from .helpers.fake_hub import start_fake_hub, start_silent_hub, write_run


TOKEN = "hf_" + "Silent0123456789abcdefghijklmnopqr"  # shaped like a user token: hf_ + 34 letters and digits
REPO = "tester/tiny-grpo"


@pytest.fixture
def hub_env(monkeypatch):
    """HF_TOKEN set, the client online and without telemetry; HF_ENDPOINT is each test's."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_GRPO_HUB_TIMEOUT", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1 for everything else
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    return monkeypatch


@pytest.fixture
def fake_hub(hub_env):
    with start_fake_hub(token=TOKEN) as server:
        hub_env.setenv("HF_ENDPOINT", server.url)
        hub_env.setattr(constants, "ENDPOINT", server.url)
        yield server


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("python -m hf_grpo.publish.hub: error: ") and err.count("\n") == 1 and err.endswith("\n"), (
        err
    )
    assert TOKEN not in err
    return err[len("python -m hf_grpo.publish.hub: error: ") : -1]


def test_a_finished_run_written_by_the_helper_is_pushed(tmp_path, fake_hub):
    """The control for the refusals below: the same folder, finished, goes up."""
    result = hub.push(write_run(tmp_path / "run"), REPO)
    assert {"adapter_model.safetensors", "adapter_config.json", "recipe.yaml", "README.md"} <= set(result.files)
    assert "hf_grpo_run.json" in result.left_out  # the manifest is the folder's, not the model's


def test_refuses_a_folder_that_is_no_run_of_hf_grpo(tmp_path, fake_hub, capsys):
    """A transformers/PEFT training folder holds the files a run of ours does, but not the manifest."""
    plain = write_run(tmp_path / "peft-run", manifest=False)
    (plain / "README.md").write_text("# My adapter\n")
    (plain / "eval_results.json").write_text(json.dumps({"eval_loss": 1.0}))
    assert hub.main([str(plain), REPO]) == 2
    assert _one_error_line(capsys) == (
        f"{plain} is not a run of hf_grpo (it has no hf_grpo_run.json, the file `hf-grpo train` writes first into its "
        "output_dir): push only an output_dir that `hf-grpo train` wrote; nothing was sent"
    )
    assert fake_hub.requests == []  # refused before any connection


def _unfinished(out, case: str) -> str:
    """Write the run of ``case`` into ``out``; what the refusal says is missing."""
    if case == "manifest and recipe only":  # killed before it saved anything
        write_run(out, weights=False)
        return "it holds no trained weights (adapter_config.json + adapter_model.safetensors, or config.json"
    if case == "checkpoints but no final adapter":  # stopped before training saved its weights
        write_run(out, weights=False)
        write_run(out / "checkpoint-1", manifest=False)
        return "it holds no trained weights"
    if case == "adapter cut short":  # killed while saving it
        path = write_run(out) / "adapter_model.safetensors"
        path.write_bytes(path.read_bytes()[:-16])
        return "adapter_model.safetensors is cut short (saving it was interrupted)"
    # a full fine-tune saved in shards, the second one never written
    write_run(out, weights=False)
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"a.weight": np.zeros(4, np.float32)}, str(out / "model-00001-of-00002.safetensors"))
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return "model-00002-of-00002.safetensors, which model.safetensors.index.json names, is missing"


@pytest.mark.parametrize(
    "case", ["manifest and recipe only", "checkpoints but no final adapter", "adapter cut short", "shard missing"]
)
def test_refuses_a_run_that_has_not_finished(tmp_path, fake_hub, capsys, case):
    out = tmp_path / "run"
    missing = _unfinished(out, case)
    assert hub.main([str(out), REPO]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"{out} is a run of hf_grpo that has not finished: {missing}"), line
    assert (
        f"; finish it with `hf-grpo train {out}/recipe.yaml --output_dir {out} --resume_from_checkpoint auto`" in line
    )
    assert line.endswith("then push; nothing was sent")
    assert fake_hub.requests == []


def test_a_hub_that_does_not_answer_ends_the_push_in_one_line(tmp_path, hub_env, capsys):
    """The endpoint accepts the connection and never replies; each request waits HF_GRPO_HUB_TIMEOUT seconds."""
    run = write_run(tmp_path / "run")
    with start_silent_hub() as silent:
        hub_env.setenv("HF_ENDPOINT", silent.url)
        hub_env.setattr(constants, "ENDPOINT", silent.url)  # a stray call of the client waits there too
        hub_env.setenv("HF_GRPO_HUB_TIMEOUT", "2")
        started = time.monotonic()
        code = hub.main([str(run), REPO])
        elapsed = time.monotonic() - started
        assert silent.connections  # the request did reach the server, which held it unanswered
    assert code == 1
    assert _one_error_line(capsys) == (
        f"push to {REPO} failed: the Hub at {silent.url} (HF_ENDPOINT) did not answer within 2 s "
        "(HF_GRPO_HUB_TIMEOUT); check that HF_ENDPOINT is right and reachable, or raise HF_GRPO_HUB_TIMEOUT on a slow "
        "connection"
    )
    assert elapsed < 60  # it ends: the 2 s are a request's, the bound is slack for a loaded machine
    assert get_session().timeout.read is None  # huggingface_hub's own client (no timeout) is back for everyone else
