"""One contract, two implementations: each protocol fact hf_grpo relies on, checked against the CPU stand-in and
against real vLLM (vLLM's CPU build, ``-m vllm``; skipped where it is not installed).

Every test here talks HTTP to a server that serves the same tiny model (2 heads of 32: vLLM's CPU attention refuses
head_dim 16) through ``VLLMServerClient`` or raw ``requests``, and asserts only what real vLLM does: where the two
differ, real vLLM is right and the stand-in is changed. What only the stand-in can do (injected faults, request
counts) is tested in ``test_vllm_client.py``.
"""

from __future__ import annotations

import math

import pytest
import requests
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_grpo.generation.server import VLLMServerProcess
from hf_grpo.generation.settings import GenerationArguments, server_command
from hf_grpo.generation.vllm_client import VLLMServerClient, VLLMServerError
from hf_grpo.generation.vllm_install import find_vllm
from hf_grpo.launch.launcher import free_port
from tests.helpers.fake_vllm_server import start_in_thread
from tests.helpers.reference import greedy, logprobs_of, make_adapter


SERVED = "tiny"
MAX_MODEL_LEN = 128
MAX_LORA_RANK = 8
EOS = 2  # the tiny tokenizer's end-of-sequence id (checked by the `tiny` fixture)
QUESTIONS = ["What is 2 + 3?", "Compute 7 * 8.", "What is 12 - 5?"]
REAL = pytest.mark.skipif(
    not find_vllm().runs_on_cpu, reason=f"vLLM's CPU build is not usable here: {find_vllm().describe()}"
)
IMPLEMENTATIONS = ["standin", pytest.param("vllm", marks=[pytest.mark.vllm, REAL])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The warm-started tiny model saved as 2 heads of 32 with 1 KV head (same tensors), reloaded from disk."""
    from hf_grpo.training.warm_start import build_tiny

    model, tokenizer = build_tiny(seed=0, warm_start_steps=40)
    model.config.num_attention_heads, model.config.num_key_value_heads = 2, 1
    assert tokenizer.eos_token_id == EOS
    path = tmp_path_factory.mktemp("tiny32")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path), path


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def server_url(request, tiny, tmp_path_factory):
    """The URL of a server with runtime LoRA loading, processed log-probs and the development routes."""
    if request.param == "standin":
        with start_in_thread(
            tiny[2],
            served_model_name=SERVED,
            enable_lora=True,
            max_lora_rank=MAX_LORA_RANK,
            allow_runtime_lora_updating=True,
            logprobs_mode="processed_logprobs",
            max_model_len=MAX_MODEL_LEN,
            dev_mode=True,
        ) as server:
            yield server.url
        return
    # real vLLM, started with the command line the launcher builds for a LoRA recipe
    gen = GenerationArguments(
        backend="vllm_server",
        port=free_port(),
        gpu_memory_utilization=0.1,
        max_model_len=MAX_MODEL_LEN,
        serve_command=find_vllm().serve_command(),
        extra_args=[*find_vllm().server_flags(), "--served-model-name", SERVED],  # as the launcher adds them
    )
    cmd, env = server_command(gen, str(tiny[2]), "lora", lora_r=MAX_LORA_RANK, dtype="float32", seed=0)
    log = tmp_path_factory.mktemp("vllm-log") / "vllm_server.log"
    with VLLMServerProcess(cmd, {**env, "VLLM_SERVER_DEV_MODE": "1"}, gen.url, log, timeout_s=600):
        yield gen.url


@pytest.fixture
def client(server_url):
    c = VLLMServerClient(server_url, request_timeout=60, connect_timeout=5, max_retries=0)
    yield c
    for card in c.models()[1:]:  # adapters a test left loaded
        c.unload_lora_adapter(card["id"], missing_ok=True)
    c.close()


@pytest.fixture
def prompts(tiny):
    return [tiny[1](q)["input_ids"] for q in QUESTIONS]


def post(url: str, route: str, body: dict) -> requests.Response:
    return requests.post(f"{url}{route}", json=body, timeout=60)


def error_of(response: requests.Response) -> dict:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}`` with ``code`` the HTTP status."""
    error = response.json()["error"]
    assert error["code"] == response.status_code
    return error


def test_health_and_models(server_url, client):
    health = requests.get(f"{server_url}/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    cards = client.models()
    assert [c["id"] for c in cards] == [SERVED]
    assert cards[0]["object"] == "model" and cards[0]["parent"] is None
    assert cards[0]["max_model_len"] == MAX_MODEL_LEN


def test_server_info_reports_processed_logprobs_in_dev_mode(server_url):
    info = requests.get(f"{server_url}/server_info", params={"config_format": "json"}, timeout=10)
    assert info.status_code == 200
    assert info.json()["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"


def test_token_ids_logprobs_and_prompt_major_order(client, tiny, prompts):
    out = client.generate(prompts, n=3, max_tokens=12, temperature=0.8, seed=3)
    assert out.prompt_ids == prompts
    assert len(out.completion_ids) == len(out.logprobs) == len(out.finish_reasons) == 3 * len(prompts)
    for j, (ids, lps, reason) in enumerate(zip(out.completion_ids, out.logprobs, out.finish_reasons, strict=True)):
        assert 1 <= len(ids) == len(lps) <= 12
        assert reason == ("length" if len(ids) == 12 and ids[-1] != tiny[1].eos_token_id else "stop")
        assert all(math.isfinite(lp) and lp <= 0 for lp in lps)
        # processed log-probs: the sampled token's log_softmax(logits / T) under the served model (choice p*n+i)
        assert lps == pytest.approx(logprobs_of(tiny[0], prompts[j // 3], ids, 0.8), abs=1e-3)
    assert out.usage["completion_tokens"] == sum(map(len, out.completion_ids))
    assert out.usage["prompt_tokens"] == 3 * sum(map(len, prompts)) or out.usage["prompt_tokens"] == sum(
        map(len, prompts)
    )


def test_raw_choice_fields(server_url, prompts):
    body = {"model": SERVED, "prompt": prompts[:2], "n": 2, "max_tokens": 4, "seed": 1, "logprobs": 0}
    body |= {"return_token_ids": True, "return_tokens_as_token_ids": True}
    answer = post(server_url, "/v1/completions", body)
    assert answer.status_code == 200
    payload = answer.json()
    assert payload["object"] == "text_completion" and payload["model"] == SERVED
    choices = payload["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    for choice in choices:
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
        for token, top in zip(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"], strict=True):
            assert token in top  # logprobs 0: the sampled token only


def test_seeds_reproduce_and_each_sample_draws_its_own(client, prompts):
    first = client.generate(prompts, n=3, max_tokens=10, seed=1234)
    again = client.generate(prompts, n=3, max_tokens=10, seed=1234)
    other = client.generate(prompts, n=3, max_tokens=10, seed=99)
    assert first.completion_ids == again.completion_ids
    flat = [[lp for seq in out.logprobs for lp in seq] for out in (first, again)]
    assert flat[0] == pytest.approx(flat[1], abs=1e-6)
    assert first.completion_ids != other.completion_ids
    assert len({tuple(ids) for ids in first.completion_ids[:3]}) > 1  # the n samples of one prompt differ
    # sample i of every prompt is drawn with seed + i: a batch equals the prompts sent one by one
    singles = [client.generate([p], n=3, max_tokens=10, seed=1234) for p in prompts]
    assert first.completion_ids == [ids for s in singles for ids in s.completion_ids]


def test_stop_token_ends_the_sequence_and_is_kept(client, tiny, prompts):
    reference = greedy(tiny[0], prompts[0], 8, eos=None)
    stop = reference[2]
    out = client.generate(prompts[:1], n=1, max_tokens=8, temperature=0.0, stop_token_ids=[stop])
    assert out.completion_ids[0] == reference[: reference.index(stop) + 1]
    assert out.finish_reasons == ["stop"]
    ignore = {"ignore_eos": True}
    capped = client.generate(prompts[:1], n=1, max_tokens=5, temperature=0.0, extra_body=ignore)
    assert capped.completion_ids[0] == reference[:5] and capped.finish_reasons == ["length"]


@pytest.mark.parametrize(
    ("field", "value", "status", "message"),
    [
        ("top_p", 0.0, 400, "top_p must be in (0, 1], got 0.0."),
        (
            "max_tokens",
            MAX_MODEL_LEN + 1,
            400,
            f"cannot be greater than max_model_len=max_total_tokens={MAX_MODEL_LEN}",
        ),
        ("logprobs", 30, 400, "Requested sample logprobs of 30, which is greater than max allowed: 20"),
        ("model", "no-such-adapter", 404, "The model `no-such-adapter` does not exist."),
    ],
)
def test_bad_requests_are_refused_like_vllm(server_url, prompts, field, value, status, message):
    body = {"model": SERVED, "prompt": prompts[0], "max_tokens": 4, field: value}
    answer = post(server_url, "/v1/completions", body)
    assert answer.status_code == status, answer.text
    error = error_of(answer)
    assert message in error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_greedy_sampling_takes_one_sample(server_url, prompts):
    body = {"model": SERVED, "prompt": prompts[0], "max_tokens": 4, "n": 2, "temperature": 0.0}
    answer = post(server_url, "/v1/completions", body)
    assert answer.status_code == 400
    assert "n must be 1 when using greedy sampling" in error_of(answer)["message"]


def test_prompt_plus_completion_over_max_model_len_is_400(client, prompts):
    long_prompt = (prompts[0] * 40)[: MAX_MODEL_LEN - 4]
    with pytest.raises(VLLMServerError) as info:
        client.generate([long_prompt], n=1, max_tokens=16)
    assert info.value.status == 400


def test_adapter_load_generate_reload_in_place_unload(client, tiny, prompts, tmp_path):
    model = tiny[0]
    tuned_model = make_adapter(model, tmp_path / "a", seed=1, scale=0.5)
    assert client.load_lora_adapter("policy", tmp_path / "a") == "Success: LoRA adapter 'policy' added successfully."
    assert {c["id"]: c["parent"] for c in client.models()} == {SERVED: None, "policy": SERVED}

    base = client.generate(prompts, n=1, max_tokens=8, temperature=0.0)
    tuned = client.generate(prompts, n=1, max_tokens=8, temperature=0.0, model="policy")
    assert base.completion_ids == [greedy(model, p, 8, EOS) for p in prompts]
    assert tuned.completion_ids == [greedy(tuned_model, p, 8, EOS) for p in prompts] != base.completion_ids
    sampled = client.generate(prompts[:1], n=2, max_tokens=8, temperature=1.0, seed=5, model="policy")
    for ids, lps in zip(sampled.completion_ids, sampled.logprobs, strict=True):
        assert lps == pytest.approx(logprobs_of(tuned_model, prompts[0], ids, 1.0), abs=1e-3)

    with pytest.raises(VLLMServerError) as info:  # the same name again, not in place
        client.load_lora_adapter("policy", tmp_path / "a", load_inplace=False)
    assert info.value.status == 400 and "has already been loaded" in str(info.value)
    retuned_model = make_adapter(model, tmp_path / "b", seed=2, scale=0.5)
    client.load_lora_adapter("policy", tmp_path / "b", load_inplace=True)
    retuned = client.generate(prompts, n=1, max_tokens=8, temperature=0.0, model="policy")
    assert retuned.completion_ids == [greedy(retuned_model, p, 8, EOS) for p in prompts]

    assert client.unload_lora_adapter("policy") == "Success: LoRA adapter 'policy' removed successfully."
    with pytest.raises(VLLMServerError) as info:
        client.generate(prompts, n=1, max_tokens=4, model="policy")
    assert info.value.status == 404
    with pytest.raises(VLLMServerError) as info:
        client.unload_lora_adapter("policy")
    assert info.value.status == 404 and "The lora adapter 'policy' cannot be found." in str(info.value)


def test_adapter_refusals(client, tiny, tmp_path):
    with pytest.raises(VLLMServerError) as info:
        client.load_lora_adapter("ghost", tmp_path / "missing")
    assert info.value.status == 404 and "Loading lora ghost failed: No adapter found for" in str(info.value)
    make_adapter(tiny[0], tmp_path / "wide", seed=0, rank=16, scale=0.5)
    with pytest.raises(VLLMServerError) as info:
        client.load_lora_adapter("wide", tmp_path / "wide")
    assert info.value.status == 500 and f"greater than max_lora_rank {MAX_LORA_RANK}" in str(info.value)
    assert [c["id"] for c in client.models()] == [SERVED]  # nothing half-loaded


def test_a_seeded_batch_larger_than_one_scheduler_step(client, tiny):
    """128 prompts of 27 tokens (x 2 samples) overflow a CPU step's 2048-token budget: vLLM's CPU build, with chunked
    prefill on, killed its engine on such a seeded request; the launcher's flags (server_flags) keep it alive."""
    prompts = [[5 + k % 50, *range(6, 32)] for k in range(128)]
    out = client.generate(prompts, n=2, max_tokens=4, seed=3)
    assert len(out.completion_ids) == 256 and all(out.completion_ids)
    assert client.health()
