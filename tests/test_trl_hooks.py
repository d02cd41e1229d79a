"""Pins the TRL internals hf_grpo relies on: if a TRL upgrade renames or re-signs one, these fail first.

One test per overridden hook (its parameter list in TRL), one for the TRL methods we call, and one for the trainer
attributes we read.
"""

from __future__ import annotations

import inspect

import pytest
import trl
from packaging.version import Version

from hf_grpo.trainer import GRPOTrainer


def params(cls, name) -> list[str]:
    return list(inspect.signature(getattr(cls, name)).parameters)


def test_trl_version_is_the_pinned_minor():
    assert Version("1.16") <= Version(trl.__version__) < Version("1.17"), trl.__version__


HOOKS = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate": ["self", "prompts"],
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
    "_generate_and_score_completions": ["self", "inputs"],
    "training_step": ["self", "model", "inputs", "num_items_in_batch"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
}


def test_every_overridden_trl_method_is_pinned_here():
    overridden = {n for n, v in vars(GRPOTrainer).items() if callable(v) and hasattr(trl.GRPOTrainer, n)}
    assert overridden - {"__init__"} == set(HOOKS)


def test_trl_init_takes_the_arguments_we_pass():
    # hf_grpo.train builds the trainer with these keywords; our __init__ forwards them to TRL's unchanged.
    passed = {"model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class", "peft_config"}
    assert passed <= set(params(trl.GRPOTrainer, "__init__")), set(params(trl.GRPOTrainer, "__init__"))
    assert "callbacks" in params(trl.GRPOTrainer, "__init__")


@pytest.mark.parametrize("name, expected", HOOKS.items())
def test_overridden_hook_signature(name, expected):
    assert name in GRPOTrainer.__dict__, f"hf_grpo no longer overrides {name}; update this list"
    assert name in trl.GRPOTrainer.__dict__, f"trl.GRPOTrainer no longer defines {name}"
    assert params(trl.GRPOTrainer, name) == expected
    assert params(GRPOTrainer, name) == expected


def test_trl_methods_we_call():
    assert params(trl.GRPOTrainer, "_get_per_token_logps_and_entropies")[:6] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
    ]
    assert "_get_output_dir" in dir(trl.GRPOTrainer)


def test_trainer_attributes_we_read():
    source = inspect.getsource(trl.GRPOTrainer.__init__)
    for attribute in (
        "self.reward_weights",
        "self.reward_func_names",
        "self._metrics",
        "self._step",
        "self.num_generations",
        "self.num_generations_eval",
        "self.scale_rewards",
        "self._is_vlm",
        "self.vllm_importance_sampling_mode",
        "self.rollout_func",
        "self.environment_factories",
    ):
        assert attribute in source or attribute in inspect.getsource(trl.GRPOTrainer), attribute


def test_scored_batch_keys_are_the_ones_dynamic_sampling_knows():
    # dynamic sampling re-assembles TRL's scored batch; a new per-row key would need handling in hf_grpo.sampling
    source = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    for key in (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
        "old_per_token_logps",
        "importance_sampling_ratio",
        "sampling_per_token_logps",
        "ref_per_token_logps",
        "tool_mask",
    ):
        assert f'"{key}"' in source, key
