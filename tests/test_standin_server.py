"""The vLLM stand-in server (tests/helpers/fake_vllm_server.py) behaves as vLLM does where tests rely on it: it
refuses the adapters vLLM refuses, serves bf16 numerics (so TRL's importance-sampling correction engages) and is
not mistaken for a server of ours already on the port."""

from __future__ import annotations

import sys
import time

import pytest
import requests
import torch

from .helpers.fake_vllm_server import start_in_thread, start_subprocess
from .helpers.trainers import make_server_trainer


def save_adapter(policy_dir, path, **lora) -> None:
    """A rank-8 q_proj/v_proj PEFT adapter of the policy (with ``lora``'s LoraConfig settings) saved at ``path``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], **lora)
    get_peft_model(AutoModelForCausalLM.from_pretrained(policy_dir), config).save_pretrained(path)


def load_into_standin(policy_dir, path):
    """(answer to /v1/load_lora_adapter for ``path``, the adapters the stand-in then serves)."""
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        answer = requests.post(
            f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(path)}, timeout=60
        )
        served = requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]
    return answer, served


@pytest.mark.parametrize(
    "lora, refusal",
    [
        ({"use_dora": True}, "vLLM does not yet support DoRA."),
        ({"modules_to_save": ["lm_head"]}, "vLLM only supports modules_to_save being None."),
        ({"bias": "lora_only"}, "Adapter bias is not supported."),
    ],
    ids=["dora", "modules_to_save", "bias"],
)
def test_the_standin_server_refuses_adapters_vllm_refuses(policy_dir, tmp_path, lora, refusal):
    """The stand-in loaded adapters that vLLM 0.22-0.31's PEFTHelper refuses."""
    save_adapter(policy_dir, tmp_path / "adapter", **lora)
    answer, served = load_into_standin(policy_dir, tmp_path / "adapter")
    assert answer.status_code == 500 and refusal in answer.text, answer.text
    assert served == {}


def test_the_standin_server_refuses_adapter_modules_vllm_does_not_apply_lora_to(policy_dir, tmp_path):
    """vLLM matches each adapter module's last name against the model's LoRA-able layers (linear
    layers and embeddings) and refuses the adapter otherwise (a vision tower's LoRA, say); the stand-in merged it."""
    from safetensors.torch import load_file, save_file

    save_adapter(policy_dir, tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    state = load_file(weights)
    a = next(k for k in state if k.endswith("q_proj.lora_A.weight"))
    state["base_model.model.visual.blocks.0.attn.proj.lora_A.weight"] = state[a].clone()
    save_file(state, weights)
    answer, served = load_into_standin(policy_dir, tmp_path / "adapter")
    assert answer.status_code == 500, answer.text
    assert "expected target modules in" in answer.text and "but received ['visual.blocks.0.attn.proj']" in answer.text
    assert "q_proj" in answer.text and served == {}


def test_the_standin_command_line_serves_bf16_numerics(policy_dir):
    """The bf16 mode was reachable only in-process; ``--numerics bfloat16`` gives it to a launched
    server (``generation.extra_args``). Its greedy log-probs then move off the fp32 server's."""

    def prompt_logprobs(*extra):
        server = start_subprocess(policy_dir, enable_lora=False, extra_args=list(extra))
        try:
            prompts = [f"{a} + {b} =" for a, b in ((12, 30), (7, 5), (48, 51), (3, 99))]
            body = {"model": str(policy_dir.resolve()), "prompt": prompts, "max_tokens": 1, "temperature": 0}
            answer = requests.post(f"{server.url}/v1/completions", json={**body, "logprobs": 0}, timeout=60)
            assert answer.status_code == 200, answer.text
            return torch.tensor([c["logprobs"]["token_logprobs"][0] for c in answer.json()["choices"]])
        finally:
            server.stop()

    fp32, bf16 = prompt_logprobs(), prompt_logprobs("--numerics", "bfloat16")
    assert fp32.shape == bf16.shape and (fp32 - bf16).abs().max() > 1e-4


@pytest.mark.parametrize("numerics", ["float32", "bfloat16"])
def test_importance_sampling_correction_engages_against_bf16_numerics(policy_dir, tmp_path, numerics):
    """With fp32 weights the stand-in returns the trainer's own log-probs, so TRL's importance-sampling
    correction was never exercised. A bf16 stand-in differs from the trainer as a bf16 vLLM does: the sampler/trainer
    log-prob gap and the correction ratio then move off 0 and 1."""
    with start_in_thread(
        policy_dir,
        enable_lora=True,
        max_lora_rank=8,
        allow_runtime_lora_updating=True,
        logprobs_mode="processed_logprobs",
        numerics=numerics,
    ) as server:
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, max_steps=1)
        trainer.train()
    record = trainer.state.log_history[0]
    gap = record["sampling/sampling_logp_difference/mean"]
    ratio_min = record["sampling/importance_sampling_ratio/min"]
    if numerics == "float32":
        assert gap < 1e-4 and ratio_min > 0.999, record
    else:
        assert gap > 1e-3 and ratio_min < 0.999, record


def test_a_server_already_on_the_port_is_not_taken_for_ours(policy_dir, tmp_path):
    """A leftover server answering /health on the port passed for the one being started."""
    from hf_grpo.generation.server import ServerStartError, VLLMServerProcess

    with start_in_thread(policy_dir) as leftover:
        slow = [sys.executable, "-c", "import time; time.sleep(60)"]  # ours, still loading its model
        server = VLLMServerProcess(slow, {}, leftover.url, tmp_path / "server.log", timeout_s=30)
        start = time.monotonic()
        with pytest.raises(ServerStartError, match=r"already accepts connections .* set generation.port"):
            server.__enter__()
        assert time.monotonic() - start < 10 and server.process is None  # refused before starting anything
