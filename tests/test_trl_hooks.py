"""Pins the TRL internals hf_grpo relies on: if a TRL upgrade renames or re-signs one, these fail first.

One test per overridden hook (its parameter list in TRL), one for the TRL methods we call, and one for the trainer
attributes we read.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
import transformers
import trl
from packaging.version import Version

from hf_grpo.training import micro_batches
from hf_grpo.training.trainer import GRPOTrainer


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
    "compute_loss": ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
        "pixel_values",
        "image_grid_thw",
        "num_images",
        "pixel_attention_mask",
        "spatial_shapes",
        "num_tiles",
        "image_sizes",
        "token_type_ids",
        "mm_token_type_ids",
        "image_position_ids",
    ],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
}


# transformers.Trainer's own hooks, which TRL leaves alone
TRANSFORMERS_HOOKS = {"get_batch_samples": ["self", "epoch_iterator", "num_batches", "device"]}
# TRL's base trainer's: its draft model card, which it writes over output_dir's README.md at every checkpoint
BASE_TRAINER_HOOKS = {"create_model_card": ["self", "model_name", "dataset_name", "tags"]}


def test_every_overridden_trl_method_is_pinned_here():
    overridden = {n for n, v in vars(GRPOTrainer).items() if callable(v) and hasattr(trl.GRPOTrainer, n)}
    assert overridden - {"__init__"} == set(HOOKS) | set(TRANSFORMERS_HOOKS) | set(BASE_TRAINER_HOOKS)


@pytest.mark.parametrize("name, expected", BASE_TRAINER_HOOKS.items())
def test_overridden_base_trainer_hook(name, expected):
    from trl.trainer.base_trainer import _BaseTrainer as BaseTrainer

    assert name in GRPOTrainer.__dict__ and name in BaseTrainer.__dict__, name
    assert name not in trl.GRPOTrainer.__dict__, f"trl.GRPOTrainer now defines {name}: ours would bypass TRL's"
    assert params(BaseTrainer, name) == params(GRPOTrainer, name) == expected


@pytest.mark.parametrize("name, expected", TRANSFORMERS_HOOKS.items())
def test_overridden_transformers_hook(name, expected):
    assert name in GRPOTrainer.__dict__, f"hf_grpo no longer overrides {name}; update this list"
    assert name not in trl.GRPOTrainer.__dict__, f"trl.GRPOTrainer now defines {name}: ours would bypass TRL's"
    assert params(transformers.Trainer, name) == expected
    assert params(GRPOTrainer, name) == expected


def test_overridden_training_arguments_hook_still_drops_the_timeout_on_the_cpu_path():
    # HfGRPOConfig._setup_devices starts the process group with ddp_timeout before transformers' cached property
    # runs, because transformers' use_cpu branch passes no timeout while keeping a group that exists. When an upgrade
    # renames the property, or passes the timeout there itself, this fails and the override can go.
    from functools import cached_property

    from hf_grpo.config import HfGRPOConfig

    assert isinstance(inspect.getattr_static(transformers.TrainingArguments, "_setup_devices"), cached_property)
    assert isinstance(inspect.getattr_static(HfGRPOConfig, "_setup_devices"), cached_property)
    source = inspect.getsource(transformers.TrainingArguments._setup_devices.func)
    cpu_branch = source[source.index("if self.use_cpu") : source.index("elif is_sagemaker_mp_enabled()")]
    assert "timeout" not in cpu_branch and 'accelerator_state_kwargs["cpu"] = True' in cpu_branch, cpu_branch
    assert "PartialState(**accelerator_state_kwargs)" in source


def test_transformers_takes_each_steps_batches_through_get_batch_samples():
    # overlapped generation reads the dataloader ahead in get_batch_samples (generation/overlap.py): every optimizer
    # step's batches must come through it, from the epoch's iterator, and our override reuses the item count
    source = inspect.getsource(transformers.Trainer)
    assert "self.get_batch_samples(epoch_iterator, num_batches, self.args.device)" in source
    assert params(transformers.Trainer, "_get_num_items_in_batch") == ["self", "batch_samples", "device"]


def test_trl_init_takes_the_arguments_we_pass():
    # hf_grpo.train builds the trainer with these keywords; our __init__ forwards them to TRL's unchanged.
    passed = {"model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class", "peft_config"}
    assert passed <= set(params(trl.GRPOTrainer, "__init__")), set(params(trl.GRPOTrainer, "__init__"))
    assert "callbacks" in params(trl.GRPOTrainer, "__init__")


# ours takes TRL's multimodal keywords as **multimodal and hands them on (to TRL's own, for a vision model)
OURS = {"_get_per_token_logps_and_entropies": HOOKS["_get_per_token_logps_and_entropies"][:8] + ["multimodal"]}


@pytest.mark.parametrize("name, expected", HOOKS.items())
def test_overridden_hook_signature(name, expected):
    assert name in GRPOTrainer.__dict__, f"hf_grpo no longer overrides {name}; update this list"
    assert name in trl.GRPOTrainer.__dict__, f"trl.GRPOTrainer no longer defines {name}"
    assert params(trl.GRPOTrainer, name) == expected
    assert params(GRPOTrainer, name) == OURS.get(name, expected)


def test_trl_methods_we_call():
    # _get_per_token_logps_and_entropies: its whole signature is pinned in HOOKS (we override it)
    assert "_get_output_dir" in dir(trl.GRPOTrainer)
    assert params(trl.GRPOTrainer, "_tokenize_prompts") == ["self", "prompts"]


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """A stock ``trl.GRPOTrainer`` on the tiny model: what TRL itself sets up and calls."""
    from .helpers import reward_scripts

    model, tokenizer, train = _tiny_parts()
    args = trl.GRPOConfig(
        str(tmp_path_factory.mktemp("stock")), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=4, report_to=[], bf16=False, use_cpu=True,
    )  # fmt: skip
    return trl.GRPOTrainer(
        model, reward_scripts.alternating, args, train_dataset=train, processing_class=tokenizer
    ), train


def test_trls_generate_tokenizes_through_tokenize_prompts(stock, monkeypatch):
    """Overlapped generation tokenizes the rounds it sends ahead with ``_tokenize_prompts`` and compares the result with
    the ids TRL passes on later (generation/overlap.py): TRL's ``_generate`` must tokenize through that method."""
    trainer, train = stock
    seen = []
    tokenize = trainer._tokenize_prompts

    def spy(prompts):
        seen.append(prompts)
        return tokenize(prompts)

    monkeypatch.setattr(trainer, "_tokenize_prompts", spy)
    prompts = [train[0]["prompt"]] * 4
    trainer._generate(prompts)
    assert seen == [prompts]


def test_trainer_attributes_we_read(stock):
    trainer, _ = stock
    for attribute in (
        "reward_weights",
        "reward_func_names",
        "_metrics",
        "_step",
        "num_generations",
        "num_generations_eval",
        "scale_rewards",
        "_is_vlm",
        "vllm_importance_sampling_mode",
        "rollout_func",
        "environment_factories",
        "loss_type",  # micro_batches.regroup_blocker: what makes a loss depend on how rows are cut
        "_entropy_bonus_enabled",
        "top_entropy_quantile",
        "aux_loss_enabled",
        "ref_model",  # shared_prompts.install_in
    ):
        assert hasattr(trainer, attribute), attribute


# The keys of TRL's scored batch that dynamic sampling re-assembles (hf_grpo.training.dynamic_sampling.collate_groups), and the
# image keys it never sees (dynamic sampling and overlap refuse vision models: GRPOTrainer._text_only_problems).
TEXT_BATCH_KEYS = {
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
}
IMAGE_BATCH_KEYS = {
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
    "num_images",
    "num_tiles",
}


def scored_batch_keys() -> set[str]:
    """Every key TRL's _generate_and_score_completions puts in the batch it returns: the ``output = {...}`` literal's
    keys and every ``output["key"] = ...`` after it, read from TRL's source with ast."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)))
    keys = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == "output" and isinstance(node.value, ast.Dict):
                keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            elif isinstance(target, ast.Subscript) and getattr(target.value, "id", None) == "output":
                keys.add(target.slice.value)
    return keys


def test_scored_batch_keys_are_the_ones_dynamic_sampling_knows():
    # a key TRL adds to (or drops from) its scored batch fails here: dynamic sampling would need to handle it
    found = scored_batch_keys()
    assert found, "TRL's scored batch is no longer built as `output = {...}`: read it again"
    assert found == TEXT_BATCH_KEYS | IMAGE_BATCH_KEYS, (
        f"new: {sorted(found - TEXT_BATCH_KEYS - IMAGE_BATCH_KEYS)}, gone: {sorted(TEXT_BATCH_KEYS | IMAGE_BATCH_KEYS - found)}"
    )


def test_the_key_reader_sees_a_key_added_to_the_batch(monkeypatch):
    # the reader above on a version of TRL's method with one more key: what an upgrade adding one would look like
    def _generate_and_score_completions(self, inputs):
        output = {"prompt_ids": 1}
        output["new_per_row_key"] = 2
        return output

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions", _generate_and_score_completions)
    assert scored_batch_keys() == {"prompt_ids", "new_per_row_key"}


# ----------------------------------------------------------------------------------------------------------------------
# Drop-in for trl.GRPOTrainer (gaps found by running TRL's own tests against our class)


def _tiny_parts():
    from hf_grpo.data import DataArguments, load_grpo_datasets
    from hf_grpo.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=16, arithmetic_eval_size=4))
    return build_model(tokenizer, hidden_size=32), tokenizer, train


def test_no_args_builds_a_default_config_as_trl_does(tmp_path, monkeypatch):
    from hf_grpo.config import HfGRPOConfig
    from hf_grpo.rewards.functions import gsm8k_correctness

    monkeypatch.chdir(tmp_path)
    model, tokenizer, train = _tiny_parts()
    trainer = GRPOTrainer(model=model, reward_funcs=gsm8k_correctness, train_dataset=train, processing_class=tokenizer)
    assert isinstance(trainer.args, HfGRPOConfig)
    assert trainer.args.output_dir.endswith("-GRPO") and trainer.args.dynamic_sampling is False


def test_a_plain_trl_config_is_converted_with_its_values(tmp_path):
    from hf_grpo.config import HfGRPOConfig
    from hf_grpo.rewards.functions import gsm8k_correctness

    model, tokenizer, train = _tiny_parts()
    plain = trl.GRPOConfig(
        str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        learning_rate=3e-4,
        steps_per_generation=2,
        report_to=[],
        bf16=False,
    )
    trainer = GRPOTrainer(model, gsm8k_correctness, plain, train_dataset=train, processing_class=tokenizer)
    assert isinstance(trainer.args, HfGRPOConfig)
    for key in (
        "output_dir",
        "per_device_train_batch_size",
        "num_generations",
        "max_completion_length",
        "learning_rate",
        "steps_per_generation",
        "generation_batch_size",
    ):
        assert getattr(trainer.args, key) == getattr(plain, key), key


def test_wrong_args_type_fails_before_any_model_loads():
    # a hub id that cannot load here: the TypeError must come first, naming the type
    with pytest.raises(TypeError, match="HfGRPOConfig.*got dict"):
        GRPOTrainer("no-such-org/no-such-model", reward_funcs=[], args={"learning_rate": 1e-5})


def test_timing_wrapper_never_masks_the_parents_exception():
    half_built = GRPOTrainer.__new__(GRPOTrainer)  # as during TRL's __init__: none of our attributes yet

    def rollout_dispatch():
        raise ValueError("the parent's own error")

    with pytest.raises(ValueError, match="the parent's own error"):
        half_built._timed("generate", rollout_dispatch)


# ----------------------------------------------------------------------------------------------------------------------
# Lines that restate TRL: each is compared with TRL's own result on the same batch, so an upgrade that
# changes TRL's computation fails here.


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """One generation batch scored by TRL's own _generate_and_score_completions, in training mode, with TRL computing
    old_per_token_logps itself (steps_per_generation 2 > gradient_accumulation_steps 1)."""
    from hf_grpo.config import HfGRPOConfig
    from hf_grpo.training.warm_start import warm_start

    from .helpers import reward_scripts

    model, tokenizer, train = _tiny_parts()
    warm_start(model, tokenizer, steps=20)
    args = HfGRPOConfig(
        str(tmp_path_factory.mktemp("pin")), per_device_train_batch_size=4, steps_per_generation=2, num_generations=4,
        max_completion_length=6, report_to=[], bf16=False, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model, [reward_scripts.alternating, reward_scripts.half_varying], args, train_dataset=train,
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.model.train()
    inputs = [train[i] for i in (0, 1) for _ in range(4)]
    output = trl.GRPOTrainer._generate_and_score_completions(trainer, inputs)
    return trainer, output


def test_old_logps_match_trls(scored):
    from hf_grpo.training import batch_logps

    trainer, output = scored
    assert output.get("old_per_token_logps") is not None, "TRL no longer computes old log-probs in this setting"
    ours = batch_logps.policy_logps(trainer, output)  # [B, C]
    mask = output["completion_mask"].bool()
    assert torch.allclose(ours[mask], output["old_per_token_logps"][mask], atol=1e-5)


@pytest.mark.parametrize("reference", ["adapter_off", "ref_model"])
def test_reference_logps_match_trls(policy_dir, tmp_path, reference):
    """The KL term's reference pass that dynamic sampling runs once on the assembled batch (batch_logps) gives TRL's
    own ref_per_token_logps of the same batch: the LoRA adapter switched off, or the ref_model TRL loads."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from hf_grpo.config import HfGRPOConfig
    from hf_grpo.training import batch_logps

    from .helpers import reward_scripts

    tokenizer, (_, _, train) = AutoTokenizer.from_pretrained(policy_dir), _tiny_parts()
    args = HfGRPOConfig(
        str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=6, report_to=[],
        bf16=False, seed=0, beta=0.1,
    )  # fmt: skip
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if reference == "adapter_off" else None
    trainer = GRPOTrainer(
        str(policy_dir), [reward_scripts.alternating], args, train_dataset=train, processing_class=tokenizer,
        peft_config=lora,
    )  # fmt: skip
    assert (trainer.ref_model is None) == (reference == "adapter_off")
    torch.manual_seed(0)
    with torch.no_grad():  # the policy a little off the reference, so that the two passes can be told apart
        for name, param in trainer.model.named_parameters():
            if param.requires_grad and (lora is None or "lora_B" in name):
                param.add_(torch.randn_like(param) * 0.05)
    trainer.model.train()
    output = trl.GRPOTrainer._generate_and_score_completions(trainer, [train[i] for i in (0, 1) for _ in range(4)])
    ours = batch_logps.reference_logps(trainer, output)  # [B, C]
    mask = output["completion_mask"].bool()
    assert torch.allclose(ours[mask], output["ref_per_token_logps"][mask], atol=1e-5)
    assert (batch_logps.policy_logps(trainer, output) - ours)[mask].abs().max() > 1e-3


def test_num_items_in_batch_matches_trls(scored):
    trainer, output = scored
    mask = output["completion_mask"]  # what DynamicSampler.batch sums (times tool_mask, absent here)
    assert int(trainer.accelerator.gather(mask.sum()).sum()) == int(output["num_items_in_batch"])


def test_total_rewards_match_trls_logged_reward(scored):
    trainer, _ = scored
    total = trainer.total_rewards(trainer._rewards)  # [B*G], as _calculate_rewards kept them for _score
    assert trainer._metrics["train"]["reward"][-1] == pytest.approx(torch.nanmean(total).item())


def with_fill_group(output: dict, loss_type: str, groups: int = 1, num_generations: int = 4) -> dict:
    """``output`` plus ``groups`` fill groups as ``DynamicSampler.batch`` appends them (rows of a dropped group, their
    completion mask zeroed, marked in ``filled``), as the trainer trains it: one micro-batch, weighed by
    ``micro_batches.arrange``."""
    rows = output["advantages"].size(0)
    extra = groups * num_generations
    batch = {}
    for key, value in output.items():
        is_row_tensor = isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == rows
        batch[key] = torch.cat([value, value[:extra]]) if is_row_tensor else value
    batch["completion_mask"][rows:] = 0
    batch["filled"] = torch.arange(rows + extra, device=batch["completion_mask"].device) >= rows
    return micro_batches.arrange([batch], 1, regroup=False, row_mean=loss_type in micro_batches.ROW_MEAN_LOSSES)[0]


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "sapo", "luspo", "bnpo", "dapo"])
def test_fill_groups_leave_the_loss_of_the_real_rows_unchanged(scored, loss_type, beta):
    """With grpo (mean over rows) and dr_grpo (rows x max length) TRL's normaliser counted the masked
    fill rows, scaling the real rows' loss and gradient by real / all rows, the KL term's too. TRL's own compute_loss
    on the real rows and ours on the same rows plus a fill group must agree, for every loss type."""
    trainer, output = scored
    trainer.loss_type, trainer.current_gradient_accumulation_steps = loss_type, 1
    trainer.model.train()
    rows = output["advantages"].size(0)  # advantages of one sign: a group-normalised batch's grpo loss is ~0
    output = {**output, "advantages": torch.linspace(0.5, 1.5, rows, device=output["advantages"].device)}
    if beta:  # a reference policy a little off the current one: a KL term that counts
        output["ref_per_token_logps"] = output["old_per_token_logps"] - 0.2
    saved, trainer.beta = trainer.beta, beta
    try:
        real = trl.GRPOTrainer.compute_loss(trainer, trainer.model, output)
        padded = trainer.compute_loss(trainer.model, with_fill_group(output, loss_type))
    finally:
        trainer.beta = saved
    assert trainer.beta == saved  # compute_loss put beta back
    assert padded.item() == pytest.approx(real.item(), rel=1e-5, abs=1e-7)
    assert real.abs().item() > 1e-6  # a loss that could differ


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "dr_grpo", "luspo"])
def test_fill_rows_leave_the_entropy_bonus_as_it_is(scored, loss_type):
    """With zero advantages and beta 0 the loss is the entropy bonus alone, a mean over completion tokens: fill rows
    (no tokens) must not change it. Rescaling TRL's whole loss to the real rows inflated it by all / real rows."""
    trainer, output = scored
    trainer.loss_type, trainer.current_gradient_accumulation_steps = loss_type, 1
    trainer.model.train()
    output = {**output, "advantages": torch.zeros_like(output["advantages"])}
    saved = trainer.beta, trainer.entropy_coef, trainer._entropy_bonus_enabled
    trainer.beta, trainer.entropy_coef, trainer._entropy_bonus_enabled = 0.0, 0.5, True
    try:
        plain = trainer.compute_loss(trainer.model, output)
        padded = trainer.compute_loss(trainer.model, with_fill_group(output, loss_type, groups=2))
    finally:
        trainer.beta, trainer.entropy_coef, trainer._entropy_bonus_enabled = saved
    assert plain.abs().item() > 1e-4  # the bonus is there to be inflated
    assert padded.item() == pytest.approx(plain.item(), rel=1e-5)
