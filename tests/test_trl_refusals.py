"""Every refusal of ``trl.GRPOTrainer.__init__`` (read from the installed TRL's source, so an upgrade that adds one
fails here) is either found by the recipe check before the model loads (``recipe.checks.check_trl_refusals``, each
shown to exit 2 with one line on a dry run) or named here with why no recipe can reach it."""

from __future__ import annotations

import ast
import inspect

import pytest

from hf_grpo.train import main


# A phrase of each refusal's message -> the overrides of recipes/tiny.yaml that meet it.
CHECKED = {
    "You passed `sync_ref_model=True` while `beta=0.0`": ["--sync_ref_model", "true"],  # the recipe's beta: 0
    "You passed `sync_ref_model=True` while using a PEFT model": ["--sync_ref_model", "true", "--beta", "0.04"],
    "Applying a PEFT adapter to `lm_head` is not supported": ["--lora_target_modules", "[q_proj, lm_head]"],
    "`cast_lm_head_to_fp32=True` is not supported when the lm_head": ["--lora_target_modules", "[lm_head]",
                                                                      "--cast_lm_head_to_fp32", "true"],
    '`liger_kernel_config={"fused_linear_cross_entropy": True}`': [
        "--use_liger_kernel", "true", "--liger_kernel_config", "{fused_linear_cross_entropy: true}"],
    "VESPO loss requires `vllm_importance_sampling_mode`": [
        "--loss_type", "vespo", "--vllm_importance_sampling_mode", "sequence_mask", "--generation.backend",
        "vllm_colocate"],
}  # fmt: skip
# A phrase of each refusal no recipe reaches -> why.
UNREACHABLE = {
    "`quantization_config` both as a trainer argument": "hf_grpo loads the model itself: no model_init_kwargs",
    "`use_transformers_continuous_batching` does not support multimodal": "text models only",
    "The `processing_class` must be either": "hf_grpo passes the tokenizer it loaded",
    "You passed `peft_config` but the `peft` library": "peft is a dependency",
    "`peft_config` must be a `peft.PeftConfig`": "built by TRL's get_peft_config",
    "You passed a `PeftModel` instance together": "the base model is loaded, the adapter added by TRL",
    "Prefix tuning requires": "LoRA only (use_peft builds a LoraConfig)",
    "Number of reward weights": "recipe.checks.check_reward_weights refuses it first",
    "The number of reward processing classes": "hf_grpo passes none",
    "Using tools with GRPOTrainer requires": "no tools",
    "Using `environment_factory` with GRPOTrainer": "no environments",
    "Using tools with GRPOTrainer on transformers below": "no tools",
    "The provided chat template does not support tool calling": "no tools",
    "Each environment instance returned by": "no environments",
    "No reward source provided": "RewardArguments requires reward_funcs",
    "Using `use_transformers_continuous_batching` requires": "pinned transformers is newer",
    "is set to {coef} but": "router_aux_loss_coef needs a Mixture-of-Experts config: checked when the model loads",
    "`train_dataset` is required unless": "hf_grpo always passes its training data",
    "A `dict` `environment_factory`": "no environments",
    "When training without a `train_dataset`": "hf_grpo always passes its training data",
    "`train_dataset` must be a `Dataset`": "hf_grpo passes a datasets.Dataset",
    "Iterable datasets require `dispatch_batches=False`": "dataset_streaming is refused by the recipe check",
    "does not support `nn.DataParallel`": "the launcher starts one process per GPU through accelerate",
}


def trl_refusals() -> list[str]:
    """The first words of every message ``GRPOTrainer.__init__`` raises, from its source."""
    from trl import GRPOTrainer

    tree = ast.parse("class _:\n" + inspect.getsource(GRPOTrainer.__init__))  # the method, indented as in its class
    messages = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            messages.append(ast.unparse(node.exc.args[0]))  # the message as written, f-string fields included
    return messages


def test_every_refusal_of_trls_trainer_is_checked_or_said_unreachable():
    messages = trl_refusals()
    assert len(messages) >= 20
    known = [*CHECKED, *UNREACHABLE]
    unlisted = [m[:100] for m in messages if not any(phrase in m for phrase in known)]
    assert not unlisted, f"TRL's GRPOTrainer refuses more than this file lists (a TRL upgrade?): {unlisted}"
    gone = [phrase for phrase in known if not any(phrase in m for m in messages)]
    assert not gone, f"refusals TRL no longer makes: {gone}"


@pytest.mark.parametrize("phrase", list(CHECKED))
def test_a_combination_trl_refuses_is_one_line_before_the_model_loads(phrase, capsys):
    """sync_ref_model with LoRA ended in TRL's NotImplementedError traceback after the model loaded."""
    assert main(["recipes/tiny.yaml", "--dry-run", *CHECKED[phrase]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TRL's GRPOTrainer refuses" in err and "Traceback" not in err, err
