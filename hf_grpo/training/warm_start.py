"""Supervised warm start: a few steps of next-token training on worked solutions, before GRPO.

Two callers:

- ``hf_grpo.models.tiny``: the embedded tiny model is built from scratch, and GRPO on a random model sees no reward at all
  (docs/data.md), so a few hundred steps on arithmetic problems make its base model;
- ``hf_grpo.run.pipeline`` with a pretrained model and ``warm_start_steps`` > 0 (``warm_start_policy``): the policy (its
  LoRA adapter with ``use_peft``) learns the training data's gold solutions (``solution_column``, e.g. one worked
  line per operation and ``#### N``) after the ``before`` evaluation and before GRPO, so the held-out gain counts
  both. A run that resumes from a checkpoint skips it: the checkpoint holds its result.

Prompt and completion are tokenized separately and joined, as GRPOTrainer does, so the prompt/completion boundary is
the same in both phases; the loss is on completion tokens only, and logits are computed only from the batch's first
completion position on (``sft_loss``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..base.progress import enabled_for, progress_bar
from ..data.arithmetic import make_split
from ..evaluation.core import prompt_token_ids
from ..evaluation.device import place_for_generation
from ..models.tiny import build_model, build_tokenizer


logger = logging.getLogger(__name__)


def sft_example(tokenizer, prompt, completion: str, chat_template_kwargs: dict | None = None) -> tuple[list[int], int]:
    """(token ids of prompt + completion + EOS, prompt length)."""
    prompt_ids = prompt_token_ids(tokenizer, prompt, chat_template_kwargs)
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, len(prompt_ids)


def sft_batch(batch: list[tuple[list[int], int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on the prompt and padding), [B, T] each."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_token_id)  # [B, T], right-padded
    labels = torch.full((len(batch), width), -100)  # [B, T], -100 = ignored
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T]
    for row, (ids, prompt_len) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled (completion) tokens: the loss ``model(**batch).loss`` returns,
    with logits only for the positions that predict a label (``logits_to_keep``, as GRPOTrainer scores completions).
    A prompt's logits are ~half of a warm-start batch's and, over a 49k vocabulary, a fifth of its time (2 cores)."""
    labels = batch["labels"]  # [B, T], -100 on prompt and padding
    first = int((labels != -100).int().argmax(dim=1).min())  # the batch's earliest completion token
    keep = labels.shape[1] - first + 1  # position first - 1 predicts it
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=keep
    ).logits  # [B, keep, V]
    targets = labels[:, first:]  # [B, keep - 1]: the token each kept position but the last predicts
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=-100)


def arithmetic_examples(n_problems: int = 4000, seed: int = 0) -> list[tuple[list[dict], str]]:
    """(chat prompt, GSM8K-style answer) pairs of the embedded train split: the tiny model's warm-start data."""
    return [([{"role": "user", "content": p["question"]}], p["answer"]) for p in make_split("train", n_problems, seed)]


def warm_start(
    model,
    tokenizer,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    n_problems: int = 4000,
    examples: Sequence[tuple] | None = None,
    progress: bool | None = None,
    chat_template_kwargs: dict | None = None,
) -> list[float]:
    """Supervised steps on the parameters that require a gradient (a PEFT model: its adapter). Returns the loss per
    step.

    ``examples`` are ``(prompt, completion)`` pairs, the prompt a message list or plain text; by default the embedded
    arithmetic train split in chat form (``arithmetic_examples``). Each step draws ``batch_size`` of them at random
    (from ``seed``); only drawn pairs are tokenized, so a dataset of millions of rows costs what the steps use.
    A progress bar counts the steps, with the last loss beside it (``progress``: see ``hf_grpo.base.progress``; in a log
    file a line every 30 s).
    """
    if steps <= 0:
        return []
    pairs = examples if examples is not None else arithmetic_examples(n_problems, seed)
    tokenized: dict[int, tuple[list[int], int]] = {}

    def example(i: int) -> tuple[list[int], int]:
        if i not in tokenized:
            tokenized[i] = sft_example(tokenizer, *pairs[i], chat_template_kwargs)
        return tokenized[i]

    generator = torch.Generator().manual_seed(seed)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    model.train()
    losses = []
    start = time.perf_counter()
    with progress_bar(steps, "warm start", enabled=progress, log_lines=True, unit="step", leave=False) as bar:
        for _ in range(steps):
            idx = torch.randint(len(pairs), (batch_size,), generator=generator).tolist()
            batch = sft_batch([example(i) for i in idx], tokenizer.pad_token_id)
            loss = sft_loss(model, {k: v.to(device) for k, v in batch.items()})
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.set_postfix_str(f"loss={losses[-1]:.3f}", refresh=False)  # drawn by update(), at most every 0.1 s
            bar.update()
    logger.info("warm start: %d steps in %.1fs, final loss %.3f", steps, time.perf_counter() - start, losses[-1])
    model.eval()
    return losses


class GoldPairs:
    """A dataset's rows as ``(prompt, solution)`` pairs, read one at a time: a warm start reads only the rows it
    draws, never a whole column of a dataset with millions of rows. Rows whose ``warm_start`` column is false are
    left out (problems for GRPO only: ``word_problems_compare``), and with ``max_lines`` (``warm_start_max_lines``)
    those whose solution has more lines: such a column is read once to find the rows."""

    def __init__(self, dataset, max_lines: int | None = None):
        self.dataset = dataset
        self.rows = range(len(dataset))  # every row, read only when drawn
        if "warm_start" in dataset.column_names:
            self.rows = [i for i, keep in enumerate(dataset["warm_start"]) if keep is None or keep]
            if not self.rows:
                raise ValueError(
                    "the training data has no row to warm-start on (column 'warm_start' is false in every row): mark "
                    "some rows true, or set warm_start_steps: 0"
                )
            logger.info("warm start: %d of %d rows (the rest are for GRPO only: column 'warm_start')",
                        len(self.rows), len(dataset))  # fmt: skip
        if max_lines is not None:
            solutions = dataset["solution"]
            self.rows = [i for i in self.rows if len(str(solutions[i]).splitlines()) <= max_lines]
            if not self.rows:
                raise ValueError(
                    f"warm_start_max_lines: {max_lines} leaves no training row to warm-start on (every gold solution "
                    f"has more lines): raise it, or remove the key to warm-start on every row"
                )
            logger.info("warm start: %d of %d rows have a solution of at most %d lines", len(self.rows),
                        len(dataset), max_lines)  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple:
        row = self.dataset[self.rows[index]]
        return row["prompt"], row["solution"]


def warm_start_policy(trainer, model_args) -> list[float]:
    """``warm_start_steps`` supervised steps of a pretrained policy on the trainer's training rows (``prompt``, and
    the gold ``solution`` as the completion), before GRPO, on the trainer's device; then every process holds process
    0's weights; ``warm_start_max_lines`` keeps it to short solutions. Its optimizer is torch's AdamW on that device,
    outside DeepSpeed (no offload). The reference of a KL term (``beta``) stays the base model: the adapter switched
    off, or TRL's copy of the loaded weights."""
    args = trainer.args
    # Under DeepSpeed the trainer places the model when training starts: before, it is where it loaded (the CPU), and
    # the warm start would train there and broadcast CPU tensors, which NCCL cannot take.
    place_for_generation(trainer.model, trainer.accelerator.device)
    losses = warm_start(
        trainer.model,
        trainer.processing_class,
        model_args.warm_start_steps,
        batch_size=model_args.warm_start_batch_size,
        lr=model_args.resolved_warm_start_lr,
        seed=args.seed,
        examples=GoldPairs(trainer.train_dataset, model_args.warm_start_max_lines),
        progress=enabled_for(args),
        chat_template_kwargs=args.chat_template_kwargs,
    )
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for param in trainer.model.parameters():  # the same draws everywhere; a different rounding must not diverge
            if param.requires_grad:
                dist.broadcast(param.data, src=0)
    return losses


def freeze_as_reference(model, weights: dict | None = None) -> None:
    """Make a frozen copy of ``model``'s LoRA adapter the KL term's reference: TRL's ``ref`` adapter, which TRL makes
    for a pretrained adapter and its reference pass switches to (``warm_start_reference``). The copy holds the
    adapter's weights now (after the warm start), or ``weights`` (the warm start's, saved: a resumed run)."""
    from peft import set_peft_model_state_dict

    if "ref" not in model.peft_config:
        model.add_adapter("ref", model.peft_config["default"])
    if weights is None:
        for name, param in model.named_parameters():
            if ".default." in name:
                model.get_parameter(name.replace(".default.", ".ref.")).data.copy_(param.data)
    else:
        set_peft_model_state_dict(model, weights, adapter_name="ref")
    for name, param in model.named_parameters():
        if ".ref." in name:
            param.requires_grad_(False)


def build_tiny(seed: int = 0, warm_start_steps: int = 0):
    """The tiny model and its tokenizer in one call, optionally warm-started."""
    tokenizer = build_tokenizer(seed=seed)
    model = build_model(tokenizer, seed=seed)
    warm_start(model, tokenizer, warm_start_steps, seed=seed)
    return model, tokenizer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    out = sys.argv[1] if len(sys.argv) > 1 else "tiny-model"
    model, tokenizer = build_tiny(warm_start_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 300)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info("wrote %s", out)
