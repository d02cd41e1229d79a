"""TRL 1.16's own vLLM code run against hf_grpo's CPU stand-ins for vLLM (``hf_grpo.vllm_standin``).

- In this process: the stand-in server's command line (as ``layout.server_command`` writes it), its development
  routes and their gating, the TCP weight transfer that replaces NCCL (refusals, a broken and a closed group), and the
  engine's strict ``load_weights``.
- In subprocesses, because the stand-in ``vllm`` package must be on ``sys.path`` before TRL is imported (and must
  not leak into this process): TRL's ``VLLMClient`` (generate, ``init_communicator``, ``update_named_params``,
  ``close_communicator``) against ``python -m tests.helpers.fake_vllm_server``, TRL's ``VLLMGeneration`` in colocate
  mode with sleep mode, and two-step GRPO runs with ``use_vllm=True`` in colocate mode (LoRA) and in server mode
  (full weights), each checking that the stand-in generated and received every step's weights.

Each subprocess script writes what it observed to a JSON file; the tests assert on it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from hf_grpo.generation.settings import GenerationArguments, server_command
from hf_grpo.vllm_standin import transport
from hf_grpo.vllm_standin.cli import no_effect_flags, parse_args
from hf_grpo.vllm_standin.engine import SamplingEngine, combined_digest, tensor_digest

from .helpers.common import REPO
from .helpers.fake_vllm_server import start_in_thread, start_subprocess
from .helpers.standin_scripts import COLOCATE_SCRIPT, SERVER_SCRIPT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_script(script: str, *args: str) -> subprocess.Popen:
    """Start ``script`` in a fresh interpreter (repository root, no stand-in on the path). The last argument is the
    JSON file it writes; its output goes to that path + ``.log``. A colocated run's process group listens on a port
    of its own: TRL's default tries 29500 first, which a test on the other xdist worker may be launching on."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": "", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(free_port())
    with open(f"{args[-1]}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def script_result(proc: subprocess.Popen, timeout: int = 300) -> dict:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with open(f"{proc.args[-1]}.log", errors="replace") as f:
        assert proc.returncode == 0, f.read()[-6000:]
    with open(proc.args[-1]) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------------------------------
# The server's command line


def test_cli_takes_the_layout_commands_and_reports_gpu_flags(monkeypatch):
    gen = GenerationArguments(backend="vllm_server", port=8123, gpu_memory_utilization=0.85, max_model_len=200)
    cmd, env = server_command(gen, "/models/tiny", "lora", lora_r=8, dtype="bfloat16", seed=7)
    assert cmd[:2] == ["vllm", "serve"]
    args = parse_args(cmd[2:])
    assert (args.model, args.bind, args.port, args.seed, args.max_model_len) == (
        "/models/tiny",
        "127.0.0.1",
        8123,
        7,
        200,
    )
    assert args.enable_lora and args.max_lora_rank == 8 and args.logprobs_mode == "processed_logprobs"
    assert no_effect_flags(args) == [
        "--gpu-memory-utilization 0.85 (no GPU)",
        "--tensor-parallel-size 1 (one CPU worker)",
        "--dtype bfloat16 (the model runs in float32)",
        "--max-loras 2 (not enforced)",
    ]
    cmd, env = server_command(GenerationArguments(backend="vllm_server"), "m", "full", 16, None, 0)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", env["VLLM_SERVER_DEV_MODE"])
    args = parse_args(cmd[2:])
    assert args.weight_transfer_config == {"backend": "nccl"} and args.max_logprobs == -1 and args.dev_mode
    assert parse_args(["--model", "m", "--max_model_len=1k"]).max_model_len == 1000  # vLLM's spellings


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["m", "--no-such-flag", "1"], {}, "unrecognized arguments: --no-such-flag"),
        (["m", "--host", "0.0.0.0"], {}, "binds loopback addresses only"),
        (["m", "--weight-transfer-config", '{"backend": "ipc"}'], {}, "implements 'nccl'"),
        (["m"], {"VLLM_SERVER_DEV_MODE": "True"}, "reads it as an integer"),
        (["--port", "1"], {}, "the model is required"),
    ],
)
def test_cli_refuses_like_vllm(argv, env, message, monkeypatch, capsys):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# Development routes and the TCP weight transfer, in this process


@pytest.fixture(scope="module")
def dev_server(tiny_model_dir):
    options = dict(dev_mode=True, weight_transfer_config={"backend": "nccl"}, logprobs_mode="processed_logprobs")
    with start_in_thread(tiny_model_dir, **options) as server:
        yield server


def post(url: str, path: str, body: dict | None = None) -> requests.Response:
    return requests.post(f"{url}{path}", json=body if body is not None else {}, timeout=60)


def test_dev_routes_exist_only_in_dev_mode(tiny_model_dir, dev_server):
    with start_in_thread(tiny_model_dir) as plain:
        for method, path in [("GET", "/server_info"), ("POST", "/init_weight_transfer_engine")]:
            r = requests.request(method, f"{plain.url}{path}", timeout=10)
            assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    url = dev_server.url
    info = requests.get(f"{url}/server_info", params={"config_format": "json"}, timeout=10).json()
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert info["vllm_config"]["weight_transfer_config"] == {"backend": "nccl"}
    assert isinstance(requests.get(f"{url}/server_info", timeout=10).json()["vllm_config"], str)  # text by default
    assert requests.get(f"{url}/get_world_size", timeout=10).json() == {"world_size": 1}
    assert post(url, "/reset_prefix_cache").json() == {"success": True}
    # vLLM's update session: start, (update), finish; out of order is an error (500) and changes nothing
    r = post(url, "/update_weights", {"update_info": {"names": [], "dtype_names": [], "shapes": []}})
    assert r.status_code == 500 and "start_weight_update must be called" in r.json()["error"]["message"]
    assert post(url, "/start_weight_update").json() == {"message": "Weight update started"}
    r = post(url, "/start_weight_update")
    assert r.status_code == 500 and "already active" in r.json()["error"]["message"]
    r = post(url, "/update_weights", {})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Missing 'update_info' in request body"
    assert post(url, "/finish_weight_update").json() == {"message": "Weight update finished"}
    assert post(url, "/finish_weight_update").status_code == 500
    with start_in_thread(tiny_model_dir, dev_mode=True) as unconfigured:
        r = post(unconfigured.url, "/init_weight_transfer_engine", {"init_info": {}})
        assert r.status_code == 500 and "Weight transfer not configured" in r.json()["error"]["message"]


def rendezvous(url: str) -> transport.CPUCommunicator:
    """TRL's order: POST /init_weight_transfer_engine in a thread while the trainer opens the group."""
    port = free_port()
    info = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "packed": True}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, "/init_weight_transfer_engine", {"init_info": info})
        try:
            communicator = transport.open_trainer_group("127.0.0.1", port, 2, timeout=20)
        finally:
            response = pending.result()
    assert response.json() == {"message": "Weight transfer initialized"}, response.text
    return communicator


def push(url: str, communicator, tensors: dict[str, torch.Tensor], announce: dict | None = None):
    """One update as TRL 1.16 sends it; ``announce`` overrides the (name, dtype, shape) metadata."""
    names = list((announce or tensors).keys())
    meta = announce or {n: (str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors.items()}
    info = {"names": names, "dtype_names": [meta[n][0] for n in names], "shapes": [meta[n][1] for n in names]}
    assert post(url, "/start_weight_update").status_code == 200
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, "/update_weights", {"update_info": info})
        transport.broadcast_packed(iter(tensors.items()), communicator, 0, lambda item: item[1])
        response = pending.result()
    if response.status_code == 200:
        assert post(url, "/finish_weight_update").status_code == 200
    return response


def served(url: str) -> dict[str, str]:
    return requests.get(f"{url}/fixture/weights", timeout=10).json()["sha256"]


def test_weight_transfer_loads_refuses_and_survives(tiny_model_dir, dev_server):
    url = dev_server.url
    engine = SamplingEngine(tiny_model_dir)  # the trainer's copy
    generator = torch.Generator().manual_seed(0)
    new = {n: p.detach() + 0.1 * torch.randn(p.shape, generator=generator) for n, p in engine.model.named_parameters()}
    communicator = rendezvous(url)
    assert push(url, communicator, new).json() == {"message": "Weights updated"}
    assert served(url) == {n: tensor_digest(t) for n, t in new.items()}
    updates = requests.get(f"{url}/fixture/weight_updates", timeout=10).json()["updates"]
    assert updates[-1]["sha256"] == combined_digest({n: tensor_digest(t) for n, t in new.items()})
    before = served(url)

    # An unknown name (400) or a wrong shape (500) loads nothing, but the broadcast completes and the group survives.
    ghost = {"model.layers.0.no_such.weight": torch.zeros(4), **new}
    r = push(url, communicator, ghost)
    assert r.status_code == 400 and "There is no module or parameter named 'model.layers.0.no_such.weight'" in r.text
    norm = "model.norm.weight"
    wrong = {norm: torch.zeros(new[norm].numel() + 1)}
    r = push(url, communicator, wrong)
    assert r.status_code == 500 and "Attempted to load weight" in r.text
    assert served(url) == before
    again = {norm: new[norm] * 2}
    assert push(url, communicator, again).status_code == 200
    assert served(url)[norm] == tensor_digest(new[norm] * 2)

    # Bytes that do not match the announcement break the group until the next rendezvous (NCCL would hang).
    r = push(url, communicator, {norm: new[norm][:-1]}, announce={norm: ("float32", list(new[norm].shape))})
    assert r.status_code == 500 and "do not match the names, dtypes and shapes" in r.text
    r = push(url, communicator, again)
    assert r.status_code == 500 and "unusable after a failed update" in r.text
    communicator = rendezvous(url)
    assert push(url, communicator, new).status_code == 200

    # TRL's close_communicator: group.store = None, group.socket = None. Both sides then fail at once.
    communicator.group.store = None
    communicator.group.socket = None
    with pytest.raises(transport.TransportError, match="group is closed"):
        transport.broadcast_packed(iter(again.items()), communicator, 0, lambda item: item[1])
    info = {"names": [norm], "dtype_names": ["float32"], "shapes": [list(new[norm].shape)]}
    assert post(url, "/start_weight_update").status_code == 200
    r = post(url, "/update_weights", {"update_info": info})
    assert r.status_code == 500 and "closed the weight transfer connection" in r.text


def test_rendezvous_checks_addresses_and_sizes(dev_server):
    r = post(dev_server.url, "/init_weight_transfer_engine", {"init_info": {"master_address": "10.1.2.3",
             "master_port": 1, "rank_offset": 1, "world_size": 2}})  # fmt: skip
    assert r.status_code == 400 and "not a loopback address" in r.text
    r = post(dev_server.url, "/init_weight_transfer_engine", {"init_info": {"rank_offset": 1, "world_size": 2,
             "master_address": "127.0.0.1", "master_port": 1, "packed": True, "surprise": 1}})  # fmt: skip
    assert r.status_code == 400 and "Invalid init_info" in r.text and "surprise" in r.text
    with pytest.raises(ValueError, match="not a loopback address"):
        transport.open_trainer_group("0.0.0.0", free_port(), 2)
    port = free_port()  # the trainer expects a world of 3, the server joins a world of 2: both refuse
    info = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, dev_server.url, "/init_weight_transfer_engine", {"init_info": info})
        with pytest.raises(transport.TransportError, match="world size 2 differs from the trainer's 3"):
            transport.open_trainer_group("127.0.0.1", port, 3, timeout=20)
        r = pending.result()
    assert r.status_code == 500 and "the trainer refused rank 1" in r.text


def test_engine_load_weights_is_strict_like_vllm(tiny_model_dir):
    engine = SamplingEngine(tiny_model_dir)
    embed = engine.model.get_input_embeddings().weight
    assert engine.model.config.tie_word_embeddings and "lm_head.weight" not in engine.parameter_names()
    with pytest.raises(ValueError, match="There is no module or parameter named 'lm_head.bias'"):
        engine.load_weights([("lm_head.bias", torch.zeros(3))])
    with pytest.raises(AssertionError, match="Attempted to load weight"):
        engine.load_weights([("model.embed_tokens.weight", torch.zeros(3, 3))])
    before = embed.detach().clone()
    assert engine.load_weights([("lm_head.weight", torch.ones_like(embed))]) == set()  # tied: vLLM skips it
    assert torch.equal(embed, before)
    loaded = engine.load_weights([("model.embed_tokens.weight", torch.ones_like(embed, dtype=torch.bfloat16))])
    assert loaded == {"model.embed_tokens.weight"} and torch.equal(embed, torch.ones_like(embed))


# ----------------------------------------------------------------------------------------------------------------------
# TRL's code against the stand-ins, in subprocesses (the scripts: tests/helpers/standin_scripts.py)


@pytest.fixture(scope="module")
def scripts(tiny_model_dir, tmp_path_factory):
    """Both trainer scripts and the stand-in server, started together (they spend most of their time importing)."""
    work = tmp_path_factory.mktemp("standin")
    model = str(tiny_model_dir)
    colocate = start_script(COLOCATE_SCRIPT, model, str(work / "colocate"), str(work / "colocate.json"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ports = [str(free_port()), str(free_port())]  # the two weight transfer groups (VLLMClient, then GRPO)
    # TRL's VLLMClient waits for the server's /health, so the trainer may start first
    server_side = start_script(SERVER_SCRIPT, model, url, *ports, str(work / "server"), str(work / "server.json"))
    extra = ["--weight-transfer-config", '{"backend": "nccl"}', "--max-logprobs", "-1"]
    extra += ["--gpu-memory-utilization", "0.9"]
    try:
        server = start_subprocess(
            tiny_model_dir, port=port, dev_mode=True, enable_lora=False, logprobs_mode="processed_logprobs",
            extra_args=extra,
        )  # fmt: skip
    except RuntimeError as exc:
        server = exc
    yield {"colocate": colocate, "server_side": server_side, "server": server}
    for proc in (colocate, server_side):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not isinstance(server, Exception):
        server.stop()


@pytest.fixture(scope="module")
def colocate_run(scripts):
    return script_result(scripts["colocate"])


@pytest.fixture(scope="module")
def server_run(scripts):
    server = scripts["server"]
    if isinstance(server, Exception):
        raise server
    result = script_result(scripts["server_side"])
    result["server_updates"] = requests.get(f"{server.url}/fixture/weight_updates", timeout=10).json()["updates"]
    result["server_stats"] = requests.get(f"{server.url}/fixture/stats", timeout=10).json()["requests"]
    result["server_log"] = server.log()
    return result


def test_standin_is_invisible_until_activated_then_is_vllm_0_31_to_trl(colocate_run):
    before = colocate_run["vllm_before_activate"]  # importing hf_grpo's stand-in modules shadows nothing
    assert before is None or "vllm_standin/fake-vllm" not in before
    assert colocate_run["version"] == "0.30.0" and colocate_run["trl_sees_vllm_0_28"]
    assert colocate_run["pythonpath_first"]  # child processes (accelerate workers) see it too


def test_standin_refuses_a_late_or_foreign_activation():
    script = """
    import sys, types
    from hf_grpo import vllm_standin
    sys.modules["vllm"] = types.ModuleType("vllm")  # someone imported another vllm first
    try:
        vllm_standin.activate()
        print("activated")
    except RuntimeError as exc:
        print("refused:", exc)
    del sys.modules["vllm"]
    import trl.generation.vllm_client  # TRL imported without vllm: it will never see one
    try:
        vllm_standin.activate()
        print("activated")
    except RuntimeError as exc:
        print("refused:", exc)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused: a different vllm is already imported"), proc.stderr[-3000:]
    assert lines[1].startswith("refused: trl.generation.vllm_client was imported before"), proc.stderr[-3000:]


def test_trl_vllm_generation_colocate(colocate_run):
    run = colocate_run
    assert "call wake_up() first" in run["generate_after_init"]  # TRL puts it to sleep (level 2) right after init
    first, after = run["first"], run["after_update"]
    for observed in (first, after):
        assert observed["prompt_ids_ok"] and observed["rows"] == 4 and observed["aligned"]
        assert observed["error_vs_policy"] < 1e-4  # processed logprobs of the synced policy, at temperature 0.7
    assert after["error_vs_old_policy"] > 1e-2  # the check can fail: the old weights give other logprobs
    assert first["loaded_per_sync"] == run["params"] and after["loaded_per_sync"] == 2 * run["params"]
    assert run["stats"]["sleep_level_2"] == 3 and run["stats"]["generate_calls"] == 2  # the refused one not counted
    assert run["asleep_after_generate"]
    errors = run["errors"]
    assert errors["unknown_name"].startswith("ValueError: There is no module or parameter named 'model.no_such")
    assert errors["wrong_shape"].startswith("AssertionError: Attempted to load weight")
    assert "n must be 1 when using greedy sampling" in errors["greedy_n2"]
    assert "top_p must be in (0, 1]" in errors["top_p_0"]
    assert "discarded the weights" in errors["discarded"]


def check_every_step_synced(history: list[dict], steps: int) -> None:
    records = [r for r in history if "sampling/sampling_logp_difference/max" in r]
    assert len(records) == steps
    for record in records:  # the engine sampled with the trainer's current weights, so their logprobs agree
        assert record["sampling/sampling_logp_difference/max"] < 1e-3, record


def test_grpo_colocate_run_generates_with_each_steps_weights(colocate_run):
    grpo = colocate_run["grpo"]
    assert grpo["steps"] == 2 and grpo["stats"]["generate_calls"] == 2 and grpo["stats"]["requests"] == 2 * 8
    syncs = grpo["syncs"]
    assert [s["step"] for s in syncs] == [0, 1]
    for sync in syncs:
        assert sync["names_equal"] and sync["held"] == sync["digest"]  # the stand-in holds what TRL sent
    assert syncs[0]["digest"] != syncs[1]["digest"]  # and TRL sent new (merged LoRA) weights at step 1
    check_every_step_synced(grpo["history"], 2)


def test_trl_vllm_client_full_weight_sync(server_run):
    run = server_run
    assert run["vllm_before_activate"] is None or "vllm_standin/fake-vllm" not in run["vllm_before_activate"]
    assert run["generate"] == {"prompt_ids_ok": True, "rows": 4, "aligned": True}
    assert run["logprobs_mode"] == "processed_logprobs"
    assert run["server_equals_trainer"]  # every tensor TRL broadcast is in the server's model
    assert run["greedy"] == {"changed": True, "equals_local": True}  # and it generates with them
    status, message = run["after_close"]
    assert status == 500 and "closed the weight transfer connection" in message  # close_communicator closed it
    log = run["server_log"]
    assert log.count("flags with no effect on CPU") == 1 and "--gpu-memory-utilization 0.9 (no GPU)" in log


def test_grpo_server_run_sends_each_steps_weights(server_run):
    grpo, updates, stats = server_run["grpo"], server_run["server_updates"], server_run["server_stats"]
    assert grpo["steps"] == 2 and len(grpo["sent"]) == 2 and grpo["sent"][0] != grpo["sent"][1]
    assert [u["sha256"] for u in updates[-2:]] == grpo["sent"]  # the server holds exactly what TRL sent, each step
    assert grpo["trainer_final"] != grpo["sent"][-1]  # the last optimizer step came after the last sync
    assert stats["POST /init_weight_transfer_engine"] == 2 and stats["POST /update_weights"] == 1 + 1 + 2
    assert stats["POST /v1/completions"] == 3 + 2  # the client checks, then one generation per step
    check_every_step_synced(grpo["history"], 2)
