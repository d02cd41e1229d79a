"""Building a tiny ``GRPOTrainer`` for a test: a small model (built, or loaded from a policy directory), the
arithmetic data set, LoRA, a tiny config and, for a vLLM server, its ``ServerGenerator``."""

from __future__ import annotations

import pytest

from .common import tiny_config, tiny_lora


@pytest.fixture(autouse=True, scope="module")  # imported by a module: before the module's own fixtures train
def one_torch_thread():
    """Train with one torch thread, as a run does (``hf_grpo.launch.launcher.torch_threads``): on CI's loaded 2-core machine
    two threads each wait for a core, and these runs in this process took 3 to 4 times as long."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def arithmetic_train(train_size: int = 64, eval_size: int = 8):
    """The arithmetic training split, ``train_size`` rows."""
    from hf_grpo.data import DataArguments, load_grpo_datasets

    return load_grpo_datasets(DataArguments(arithmetic_train_size=train_size, arithmetic_eval_size=eval_size))[0]


def make_trainer(
    output_dir,
    *,
    model=None,
    tokenizer=None,
    reward_funcs=None,
    train_dataset=None,
    hidden_size: int = 32,
    train_size: int = 64,
    generator=None,
    callbacks=None,
    reward_processing_classes=None,
    eval_dataset=None,
    **overrides,
):
    """A ``GRPOTrainer`` with LoRA and ``tiny_config(output_dir, **overrides)``. Unless given: a fresh tiny model of
    ``hidden_size`` and its tokenizer, gsm8k_correctness as the reward and ``train_size`` arithmetic rows."""
    from hf_grpo.models.tiny import build_model, build_tokenizer
    from hf_grpo.rewards.functions import gsm8k_correctness
    from hf_grpo.training import trainer as trainer_module

    tokenizer = build_tokenizer() if tokenizer is None else tokenizer
    extra = {"generator": generator, "callbacks": callbacks, "reward_processing_classes": reward_processing_classes}
    extra["eval_dataset"] = eval_dataset
    return trainer_module.GRPOTrainer(  # looked up when called: a test may have patched the module
        model=build_model(tokenizer, hidden_size=hidden_size) if model is None else model,
        reward_funcs=gsm8k_correctness if reward_funcs is None else reward_funcs,
        args=tiny_config(output_dir, **overrides),
        train_dataset=arithmetic_train(train_size) if train_dataset is None else train_dataset,
        processing_class=tokenizer,
        peft_config=tiny_lora(),
        **{key: value for key, value in extra.items() if value is not None},
    )


def make_server_trainer(policy_dir, tmp_path, url, reward=None, train_size: int = 128, **overrides):
    """A trainer of the policy at ``policy_dir`` that generates on the vLLM server at ``url``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_grpo.generation.server_generator import ServerGenerator

    generator = ServerGenerator(url, tmp_path / "adapters", request_timeout=30, max_retries=3, server_timeout=30)
    return make_trainer(
        tmp_path,
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        tokenizer=AutoTokenizer.from_pretrained(policy_dir, padding_side="left"),
        reward_funcs=reward,
        train_size=train_size,
        generator=generator,
        **overrides,
    )
