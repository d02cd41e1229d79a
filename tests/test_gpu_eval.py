"""Evaluation on a CUDA GPU, without vLLM (``python -m pytest --tier gpu``; skipped where torch sees no GPU).

``hf-grpo eval`` of a saved LoRA adapter generates on the GPU: every ``generate`` call finds the model's parameters,
LoRA's too, on cuda:0, and the log line names the device and the GPU batch. tests/test_eval_device.py covers the
choice on a machine without one.
"""

from __future__ import annotations

import logging

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GenerationMixin

from hf_grpo import evaluate as hf_evaluate
from hf_grpo.evaluation.device import CUDA_BATCH


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_eval_of_a_saved_adapter_generates_on_the_gpu(policy_dir, tmp_path, monkeypatch, caplog):
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(policy_dir),
        LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model.save_pretrained(tmp_path / "adapter")  # its adapter_config.json names policy_dir as the base
    where: list[set] = []
    original = GenerationMixin.generate

    def recording(self, *args, **kwargs):
        kinds = {
            name: next((k for k in ("lora_A", "lora_B") if k in name), "base") for name, _ in self.named_parameters()
        }
        where.append({(kinds[name], p.device) for name, p in self.named_parameters()})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording)
    argv = [str(tmp_path / "adapter"), "--dataset", "arithmetic", "--max-samples", "80", "--max-new-tokens", "8"]
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert hf_evaluate.main(argv) == 0
    assert len(where) == 2, "80 problems: one batch of 64, one of 16"
    cuda = torch.device("cuda", 0)
    for devices in where:
        assert {device for _, device in devices} == {cuda}, devices
        assert {kind for kind, _ in devices} >= {"base", "lora_A", "lora_B"}  # the adapter's weights ran there too
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating ")]
    assert f"on cuda:0 ({torch.cuda.get_device_name(0)}), {CUDA_BATCH} problems per batch" in line, line
