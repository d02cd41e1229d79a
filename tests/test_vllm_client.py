"""``VLLMServerClient`` against the fake vLLM server over real HTTP on 127.0.0.1, with the embedded tiny model."""

from __future__ import annotations

import hashlib
import logging
import math
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from hf_grpo.generation.vllm_client import GenerationResult, VLLMConnectionError, VLLMServerClient, VLLMServerError
from tests.helpers.fake_vllm_server import start_in_thread, start_subprocess
from tests.helpers.reference import greedy, logprobs_of, make_adapter


SERVED = "tiny"
QUESTIONS = ["What is 2+3?", "Compute 7*8.", "12-5 =", "Add 40 and 2.", "9/3?"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_grpo.training.warm_start import build_tiny

    model, tokenizer = build_tiny(seed=0, warm_start_steps=0)
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model.eval(), tokenizer, path


@pytest.fixture(scope="module")
def server(tiny):
    handle = start_in_thread(
        tiny[2],
        served_model_name=SERVED,
        enable_lora=True,
        max_lora_rank=8,
        allow_runtime_lora_updating=True,
        max_completion_prompts=4,
    )
    yield handle
    handle.stop()


@pytest.fixture
def client(server):
    requests.post(f"{server.url}/fixture/reset", json={"adapters": True}, timeout=5).raise_for_status()
    c = VLLMServerClient(server.url, request_timeout=10, connect_timeout=2, max_retries=3, backoff=0.05)
    yield c
    c.close()


@pytest.fixture
def prompts(tiny):
    return [tiny[1](q)["input_ids"] for q in QUESTIONS[:3]]


def stats(url: str) -> dict:
    return requests.get(f"{url}/fixture/stats", timeout=5).json()["requests"]


def fixture_post(url: str, route: str, **body) -> None:
    requests.post(f"{url}/fixture/{route}", json=body, timeout=5).raise_for_status()


def test_health_and_models(client):
    assert client.health()
    client.wait_until_healthy(timeout_s=5)
    cards = client.models()
    assert [c["id"] for c in cards] == [SERVED]
    assert client.base_model == SERVED


def test_generate_shapes_and_logprobs(client, tiny, prompts):
    model = tiny[0]
    out = client.generate(prompts, n=4, max_tokens=12, seed=3)
    assert isinstance(out, GenerationResult)
    assert out.prompt_ids == prompts
    assert len(out.completion_ids) == len(out.logprobs) == len(out.finish_reasons) == len(prompts) * 4
    for j, (ids, lps, reason) in enumerate(zip(out.completion_ids, out.logprobs, out.finish_reasons, strict=True)):
        assert 1 <= len(ids) == len(lps) <= 12
        assert reason == ("stop" if ids[-1] == tiny[1].eos_token_id else "length")
        assert all(math.isfinite(lp) and lp <= 0 for lp in lps)
        # The server reports the logprob of each sampled token under the model (raw mode, temperature 1).
        expected = logprobs_of(model, prompts[j // 4], ids)
        assert lps == pytest.approx(expected, abs=1e-4)
    assert out.usage["completion_tokens"] == sum(len(ids) for ids in out.completion_ids)
    trl = out.to_trl()
    assert trl["prompt_ids"] == prompts and trl["completion_ids"] == out.completion_ids
    assert [len(seq) for seq in trl["logprobs"]] == [len(ids) for ids in out.completion_ids]
    assert all(len(pos) == 1 for seq in trl["logprobs"] for pos in seq)
    assert trl["logprob_token_ids"][0] == [[t] for t in out.completion_ids[0]]


def test_prompt_major_order(client, tiny, prompts):
    """Greedy decoding makes each prompt's completions identifiable: choice p*n+i belongs to prompt p."""
    eos = tiny[1].eos_token_id
    out = client.generate(prompts, n=1, max_tokens=8, temperature=0.0)  # vLLM refuses n > 1 when greedy
    for p, prompt in enumerate(prompts):
        assert out.completion_ids[p] == greedy(tiny[0], prompt, 8, eos)
    # A seeded batch equals the same prompts sent one by one (each prompt's samples are drawn with seed+i).
    batch = client.generate(prompts, n=3, max_tokens=8, seed=11)
    singles = [client.generate([p], n=3, max_tokens=8, seed=11) for p in prompts]
    assert batch.completion_ids == [ids for s in singles for ids in s.completion_ids]


def test_seed_reproducibility(client, prompts):
    first = client.generate(prompts, n=3, max_tokens=10, seed=1234)
    again = client.generate(prompts, n=3, max_tokens=10, seed=1234)
    other = client.generate(prompts, n=3, max_tokens=10, seed=99)
    assert first.completion_ids == again.completion_ids and first.logprobs == again.logprobs
    assert first.completion_ids != other.completion_ids
    # Within one request the n samples of a prompt differ (seed+i each).
    assert len({tuple(ids) for ids in first.completion_ids[:3]}) > 1


def test_chunks_prompt_lists_over_server_limit(client, server, tiny):
    """The server takes at most 4 prompts per request (VLLM_MAX_COMPLETION_PROMPTS): larger batches are split."""
    prompts = [tiny[1](q)["input_ids"] for q in QUESTIONS]
    with pytest.raises(VLLMServerError) as info:
        client.generate(prompts, n=1, max_tokens=4, temperature=0.0)
    assert info.value.status == 400 and "exceeds the maximum allowed count" in str(info.value)
    chunked = VLLMServerClient(server.url, request_timeout=10, max_prompts_per_request=2)
    out = chunked.generate(prompts, n=1, max_tokens=4, temperature=0.0)
    assert out.prompt_ids == prompts and len(out.completion_ids) == 5
    assert stats(server.url)["POST /v1/completions"] == 1 + 3
    eos = tiny[1].eos_token_id
    assert out.completion_ids[4] == greedy(tiny[0], prompts[4], 4, eos)


def test_unknown_model_is_404_without_retry(client, server, prompts):
    with pytest.raises(VLLMServerError) as info:
        client.generate(prompts, n=1, max_tokens=4, model="no-such-adapter")
    assert info.value.status == 404 and info.value.error_type == "NotFoundError"
    assert "The model `no-such-adapter` does not exist." in str(info.value) and server.url in str(info.value)
    assert stats(server.url)["POST /v1/completions"] == 1


def test_bad_sampling_value_is_400(client, prompts):
    with pytest.raises(VLLMServerError, match="top_p must be in"):
        client.generate(prompts, n=1, max_tokens=4, top_p=0.0)


def test_lora_adapter_load_generate_reload_unload(client, server, tiny, prompts, tmp_path):
    model, tokenizer, _ = tiny
    eos = tokenizer.eos_token_id
    adapter_dir = tmp_path / "adapter"
    peft_model = make_adapter(model, adapter_dir, seed=1)
    weights = adapter_dir / "adapter_model.safetensors"

    assert "Success" in client.load_lora_adapter("policy", adapter_dir)
    loaded = requests.get(f"{server.url}/fixture/adapters", timeout=5).json()["adapters"]
    assert loaded["policy"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert {c["id"]: c.get("parent") for c in client.models()} == {SERVED: None, "policy": SERVED}

    base = client.generate(prompts, n=1, max_tokens=10, temperature=0.0)
    tuned = client.generate(prompts, n=1, max_tokens=10, temperature=0.0, model="policy")
    assert tuned.completion_ids != base.completion_ids
    for prompt, ids in zip(prompts, tuned.completion_ids, strict=True):
        assert ids == greedy(peft_model, prompt, 10, eos)
    sampled = client.generate(prompts[:1], n=2, max_tokens=10, seed=5, model="policy")
    for ids, lps in zip(sampled.completion_ids, sampled.logprobs, strict=True):
        assert lps == pytest.approx(logprobs_of(peft_model, prompts[0], ids), abs=1e-4)

    # Loading the same name again without load_inplace is refused (400, no retry) ...
    with pytest.raises(VLLMServerError) as info:
        client.load_lora_adapter("policy", adapter_dir, load_inplace=False)
    assert info.value.status == 400 and "already been loaded" in str(info.value)
    # ... and with it (the per-step sync) the new weights replace the old ones under the same name and id.
    new_model = make_adapter(model, adapter_dir, seed=2)
    client.load_lora_adapter("policy", adapter_dir)
    reloaded = requests.get(f"{server.url}/fixture/adapters", timeout=5).json()["adapters"]["policy"]
    assert reloaded["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest() != loaded["policy"]["sha256"]
    assert reloaded["lora_int_id"] == loaded["policy"]["lora_int_id"] and reloaded["load_count"] == 2
    retuned = client.generate(prompts, n=1, max_tokens=10, temperature=0.0, model="policy")
    assert retuned.completion_ids == [greedy(new_model, p, 10, eos) for p in prompts] != tuned.completion_ids

    assert "removed" in client.unload_lora_adapter("policy")
    with pytest.raises(VLLMServerError) as info:
        client.generate(prompts, n=1, max_tokens=4, model="policy")
    assert info.value.status == 404
    with pytest.raises(VLLMServerError) as info:
        client.unload_lora_adapter("policy")
    assert info.value.status == 404 and "cannot be found" in str(info.value)
    assert client.unload_lora_adapter("policy", missing_ok=True) == ""


def test_lora_errors(client, server, tiny, tmp_path):
    with pytest.raises(VLLMServerError) as info:
        client.load_lora_adapter("ghost", tmp_path / "missing")
    assert info.value.status == 404 and "No adapter found" in str(info.value)
    make_adapter(tiny[0], tmp_path / "wide", seed=0, rank=16)
    with pytest.raises(VLLMServerError) as info:
        client.load_lora_adapter("wide", tmp_path / "wide")
    assert info.value.status == 500 and "greater than max_lora_rank 8" in str(info.value)
    assert stats(server.url)["POST /v1/load_lora_adapter"] == 2  # errors other than 429/502/503/504: no retry


def test_runtime_lora_updating_disabled(tiny, tmp_path):
    make_adapter(tiny[0], tmp_path / "a", seed=0)
    with start_in_thread(tiny[2], served_model_name=SERVED, enable_lora=True) as plain:
        client = VLLMServerClient(plain.url, request_timeout=5, max_retries=0)
        with pytest.raises(VLLMServerError) as info:
            client.load_lora_adapter("a", tmp_path / "a")
    assert info.value.status == 404 and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(info.value)


def test_processed_logprobs_mode(tiny, prompts):
    with start_in_thread(tiny[2], served_model_name=SERVED, logprobs_mode="processed_logprobs") as processed:
        client = VLLMServerClient(processed.url, request_timeout=10)
        out = client.generate(prompts[:1], n=2, max_tokens=6, temperature=0.7, seed=0)
    for ids, lps in zip(out.completion_ids, out.logprobs, strict=True):
        assert lps == pytest.approx(logprobs_of(tiny[0], prompts[0], ids, temperature=0.7), abs=1e-4)


def test_retries_503_transparently(client, server, prompts):
    reference = client.generate(prompts, n=2, max_tokens=6, seed=7)
    fixture_post(server.url, "reset")
    fixture_post(server.url, "fail", count=2, status=503, path="/v1/completions")
    out = client.generate(prompts, n=2, max_tokens=6, seed=7)
    assert out.completion_ids == reference.completion_ids and out.logprobs == reference.logprobs
    assert stats(server.url)["POST /v1/completions"] == 3


def test_persistent_503_raises_after_retries(server, prompts):
    client = VLLMServerClient(server.url, request_timeout=5, max_retries=2, backoff=0.05)
    fixture_post(server.url, "reset")
    fixture_post(server.url, "fail", count=10, status=503, path="/v1/completions")
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as info:
        client.generate(prompts, n=1, max_tokens=4, model=SERVED)
    assert time.monotonic() - start < client.worst_case_s
    assert info.value.status == 503 and "after 3 attempts" in str(info.value) and server.url in str(info.value)
    assert stats(server.url)["POST /v1/completions"] == 3
    fixture_post(server.url, "reset")


def test_hung_server_times_out(server, prompts):
    client = VLLMServerClient(server.url, request_timeout=0.3, connect_timeout=1, max_retries=1, backoff=0.05)
    fixture_post(server.url, "reset")
    fixture_post(server.url, "delay", seconds=1.5, count=2, path="/v1/completions")
    start = time.monotonic()
    with pytest.raises(VLLMConnectionError) as info:
        client.generate(prompts, n=1, max_tokens=4, model=SERVED)
    assert time.monotonic() - start < client.worst_case_s
    # the read timeout fired (the delayed answer would have been a success), and the request was not resent
    message = str(info.value)
    assert server.url in message and "did not answer within request_timeout 0.3s (ReadTimeout)" in message, message
    assert stats(server.url)["POST /v1/completions"] == 1
    fixture_post(server.url, "reset")


def test_a_frozen_server_is_not_asked_again_and_the_wait_is_logged(server, prompts, monkeypatch, caplog):
    """A server that accepts a request and never answers was asked max_retries more times, each waiting
    request_timeout (40 minutes with the defaults), without a log line."""
    from hf_grpo.generation import vllm_client

    monkeypatch.setattr(vllm_client, "HEARTBEAT_S", 0.1)
    client = VLLMServerClient(server.url, request_timeout=0.6, connect_timeout=1, max_retries=3, backoff=0.05)
    fixture_post(server.url, "reset")
    fixture_post(server.url, "delay", seconds=3, count=4, path="/v1/completions")
    start = time.monotonic()
    with (
        caplog.at_level(logging.INFO, logger="hf_grpo.generation.vllm_client"),
        pytest.raises(VLLMConnectionError) as info,
    ):
        client.generate(prompts, n=1, max_tokens=4, model=SERVED)
    assert time.monotonic() - start < client.worst_case_s
    assert stats(server.url)["POST /v1/completions"] == 1  # one request_timeout waited, not four
    assert "did not answer within request_timeout 0.6s" in str(info.value)
    beats = [r.message for r in caplog.records if r.message.startswith("still waiting for")]
    assert beats and "POST /v1/completions" in beats[0] and "of 1 s" in beats[0], beats
    fixture_post(server.url, "reset")


def test_killed_server_raises_within_bound(tiny, prompts):
    server = start_subprocess(tiny[2], served_model_name=SERVED)
    try:
        client = VLLMServerClient(server.url, request_timeout=5, connect_timeout=1, max_retries=2, backoff=0.1)
        client.wait_until_healthy(timeout_s=10)
        assert len(client.generate(prompts, n=2, max_tokens=4).completion_ids) == 6
        # Crash mid-request: the server holds the request (injected delay) and is SIGKILLed while it does.
        fixture_post(server.url, "delay", seconds=30, path="/v1/completions")
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.generate, prompts, 2, 4)
            time.sleep(0.5)
            killed_at = time.monotonic()
            server.kill()
            with pytest.raises(VLLMConnectionError) as info:
                pending.result(timeout=60)
        assert time.monotonic() - killed_at < client.worst_case_s
        # the dropped connection was seen (then refused on each retry), not waited out as a request_timeout
        message = str(info.value)
        assert server.url in message and "vllm serve" in message, message
        assert "after 3 attempts" in message and "Connection refused" in message, message
        # Later calls fail fast too (connection refused on every attempt).
        start = time.monotonic()
        with pytest.raises(VLLMConnectionError, match=server.url) as info:
            client.generate(prompts, n=1, max_tokens=4)
        assert time.monotonic() - start < client.worst_case_s
        assert "after 3 attempts" in str(info.value) and "Connection refused" in str(info.value), str(info.value)
        assert not client.health()
    finally:
        server.stop()


def test_wait_until_healthy_on_closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, connect_timeout=0.5)
    assert not client.health()
    start = time.monotonic()
    with pytest.raises(VLLMConnectionError) as info:
        client.wait_until_healthy(timeout_s=1.0, poll_interval_s=0.2)
    assert time.monotonic() - start < 3
    message = str(info.value)
    assert url in message and "vllm serve" in message and "waiting" in message


def test_per_prompt_seeds_reuse_a_bounded_set_of_connections(server, prompts):
    """generate(seeds=...) sends one request per prompt from a pool of threads, each with its own session: the pool
    is kept, so a long run does not open new sessions (and sockets) on every call."""
    client = VLLMServerClient(server.url, request_timeout=10, max_concurrent_requests=2)
    reference = [client.generate([p], n=2, max_tokens=4, seed=100 + 2 * j) for j, p in enumerate(prompts)]
    for _ in range(5):
        out = client.generate(prompts, n=2, max_tokens=4, seeds=[100 + 2 * j for j in range(len(prompts))])
        assert out.completion_ids == [ids for r in reference for ids in r.completion_ids]  # in prompt order
    assert len(client._sessions) <= 3  # the caller's thread and the 2 pool threads
    client.close()
    assert client._sessions == [] and client._pool is None
