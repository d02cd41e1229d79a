"""Log-probabilities of an assembled dynamic-sampling batch, each one forward pass over the batch with TRL's own
scoring function (``_get_per_token_logps_and_entropies``, so ``shared_prompts`` applies):

- ``policy_logps``: the current policy's, pi_old of the groups carried to the next step (DynamicSampler);
- ``reference_logps``: the reference's, for the KL term (``beta`` > 0), as TRL computes them in
  ``_generate_and_score_completions``: ``ref_model`` when TRL made one, else the adapter switched off (or the ``ref``
  adapter TRL loads when an existing adapter is trained again).

Why the reference is computed here and not in every round: with dynamic sampling TRL would run the reference over
every round's completions, and a round's groups whose rewards are all equal are thrown away. Skipping it in the rounds
(``rounds_skip_reference``) and running it once on the batch that trains costs one forward pass a step instead of one
a round; the reference does not change during a run, so a carried group gets the values it would have had. With
``sync_ref_model`` it does change (TRL mixes the policy into it every few steps), and TRL's per-round path is kept.
``tests/test_trl_hooks.py`` compares both with TRL's own results on the same batch.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter


logger = logging.getLogger(__name__)


def policy_logps(trainer, batch: dict, model=None) -> torch.Tensor:
    """Per-token log-probs of ``batch``'s completions under ``model`` (the trainer's policy by default), no grad;
    in micro-batches of ``per_device_train_batch_size``, as TRL scores a training batch. [B, C]"""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # [B, P+C]
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model if model is None else model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return logps  # [B, C]


def reference_logps(trainer, batch: dict) -> torch.Tensor:
    """Per-token log-probs of ``batch``'s completions under the KL term's reference, chosen as TRL chooses it. [B, C]"""
    if trainer.ref_model is not None:
        return policy_logps(trainer, batch, trainer.ref_model)
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return policy_logps(trainer, batch)


def defers_reference(trainer) -> bool:
    """Whether dynamic sampling's rounds skip the reference pass, run once on the assembled batch instead; logs
    once why not when a KL term keeps TRL's per-round pass."""
    if trainer.beta == 0.0:
        return False
    if trainer.args.sync_ref_model:
        logger.info("sync_ref_model: the reference changes during the run, so every dynamic-sampling round runs it")
        return False
    return True


@contextlib.contextmanager
def rounds_skip_reference(trainer, skip: bool):
    """TRL's scoring without its reference pass (the only use of ``beta`` there) while ``skip``."""
    if not skip:
        yield
        return
    beta, trainer.beta = trainer.beta, 0.0
    try:
        yield
    finally:
        trainer.beta = beta
