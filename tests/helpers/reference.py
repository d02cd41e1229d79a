"""Reference computations the vLLM tests compare a server's answers with: greedy decoding, the trainer's logprobs,
and a random LoRA adapter saved as vLLM loads it."""

from __future__ import annotations

import copy

import torch
from peft import LoraConfig, get_peft_model


@torch.no_grad()
def logprobs_of(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of each completion token, from one forward pass (what the trainer computes)."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logprobs = (logits / temperature).log_softmax(-1)
    return logprobs[torch.arange(len(completion)), torch.tensor(completion)].tolist()


@torch.no_grad()
def greedy(model, prompt: list[int], max_tokens: int, eos: int | None) -> list[int]:
    """Greedy decoding up to and including the EOS token (``eos=None``: run through it)."""
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        if ids[-1] == eos:
            break
    return ids[len(prompt) :]


def make_adapter(model, directory, seed: int, rank: int = 4, scale: float = 1.0):
    """A LoRA on q_proj/v_proj with random (non-zero) A and B times ``scale``, saved as safetensors; returns the PEFT
    model."""
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=rank, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.data = torch.randn(param.shape, generator=generator) * scale
    peft_model.save_pretrained(directory)
    return peft_model.eval()
