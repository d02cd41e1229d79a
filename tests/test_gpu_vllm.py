"""Real vLLM on a GPU (run with ``python -m pytest -m gpu`` on a machine with CUDA and ``hf_grpo[vllm]``).

The same paths the CPU tests cover against tests/helpers/fake_vllm_server.py, against ``vllm serve`` itself:
adapter-only LoRA sync changes what the server generates, and a short training run with TRL's colocated engine.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest
import torch

from hf_grpo.generation.server import VLLMServerProcess
from hf_grpo.generation.settings import GenerationArguments, server_command
from hf_grpo.generation.vllm_client import VLLMServerClient


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (pip install -e '.[vllm]')"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_hot_loads_the_adapter(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gen = GenerationArguments(
        backend="vllm_server",
        gpus=[0],
        port=free_port(),
        gpu_memory_utilization=0.3,
        max_model_len=256,
        extra_args=["--enforce-eager"],
    )
    cmd, env = server_command(gen, str(tiny_model_dir), "lora", lora_r=8, dtype="float32", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Tom has 3 pens. Tom gets 4 more."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    ]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p))
    model.save_pretrained(tmp_path / "adapter")
    with VLLMServerProcess(cmd, env, gen.url, tmp_path / "vllm.log", timeout_s=600):
        client = VLLMServerClient(gen.url)
        base = client.generate(prompt, n=1, max_tokens=12, temperature=0.0).completion_ids
        client.load_lora_adapter("policy-1", str(tmp_path / "adapter"))
        tuned = client.generate(prompt, n=1, max_tokens=12, temperature=0.0, model="policy-1").completion_ids
        sampled = client.generate(prompt, n=4, max_tokens=12, temperature=1.0, model="policy-1")
    assert base != tuned
    assert len(sampled.completion_ids) == 4 and all(
        len(c) == len(lp) for c, lp in zip(sampled.completion_ids, sampled.logprobs, strict=True)
    )


def test_short_run_with_colocated_vllm(tiny_model_dir, tmp_path):
    from hf_grpo.train import train

    results = train(
        "recipes/tiny.yaml",
        model_name_or_path=str(tiny_model_dir),
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        warm_start_steps=0,
        arithmetic_eval_size=16,
        logging_steps=1,
        generation={"backend": "vllm_colocate", "gpu_memory_utilization": 0.3, "max_model_len": 256},
    )
    assert set(results) == {"before", "after"}
