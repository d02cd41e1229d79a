"""Generate answers for a prompt dataset with transformers and grade them.

This is the evaluation that the training run records as ``eval_results.json`` (before and after GRPO) and that
``python -m hf_grpo.evaluate`` reports: greedy pass@1 (and sampled pass@k when ``num_samples > 1``), with the counts
of correct, wrong and unparseable answers from ``hf_grpo.rewards.grade``.

Prompts are rendered with the tokenizer's chat template exactly as GRPOTrainer renders them for generation, so the
numbers measure the same behaviour that training optimizes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..rewards.functions import grade_completion


@dataclass
class EvalResult:
    """Aggregate result of one evaluation; ``records`` holds one dict per example."""

    accuracy: float
    correct: int
    wrong: int
    unparseable: int
    total: int
    num_samples: int = 1
    pass_at_k: float | None = None
    records: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("records")
        return out


def prompt_token_ids(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt exactly as GRPOTrainer builds them: chat template for a message list, plain text as is."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    num_return_sequences: int = 1,
    batch_size: int = 64,
) -> list[list[str]]:
    """Completions for each prompt (``num_return_sequences`` each), decoded without special tokens."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    outputs: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [prompt_token_ids(tokenizer, p) for p in prompts[start : start + batch_size]]
        width = max(len(ids) for ids in chunk)
        input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, P] left-padded
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, ids in enumerate(chunk):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        generated = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_p=None,
            top_k=None,
            num_return_sequences=num_return_sequences,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # [B * n, P + C]
        texts = tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
        outputs += [texts[i : i + num_return_sequences] for i in range(0, len(texts), num_return_sequences)]
    model.train(was_training)
    return outputs


def grade_generations(
    dataset, task: str, greedy: list[list[str]], sampled: list[list[str]] | None = None, gold_column: str = "solution"
) -> EvalResult:
    """Grade generated texts (one greedy completion per problem, optionally k samples) into an EvalResult."""
    prompts, golds = list(dataset["prompt"]), list(dataset[gold_column])
    records, counts, hits = [], {"correct": 0, "wrong": 0, "unparseable": 0}, 0
    for i, (prompt, gold) in enumerate(zip(prompts, golds, strict=True)):
        completion = greedy[i][0]
        verdict = grade_completion(task, completion, gold)
        counts[verdict] += 1
        record = {"index": i, "prompt": prompt, "gold": gold, "completion": completion, "grade": verdict}
        if sampled is not None:
            sample_grades = [grade_completion(task, c, gold) for c in sampled[i]]
            record["samples"] = sampled[i]
            record["sample_grades"] = sample_grades
            hits += "correct" in sample_grades
        records.append(record)
    total = len(prompts)
    return EvalResult(
        accuracy=counts["correct"] / total if total else 0.0,
        correct=counts["correct"],
        wrong=counts["wrong"],
        unparseable=counts["unparseable"],
        total=total,
        num_samples=len(sampled[0]) if sampled else 1,
        pass_at_k=hits / total if sampled is not None and total else None,
        records=records,
    )


def evaluate(
    model,
    tokenizer,
    dataset,
    task: str,
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float = 1.0,
    batch_size: int = 64,
    gold_column: str = "solution",
) -> EvalResult:
    """Greedy accuracy on ``dataset`` (columns ``prompt`` and ``gold_column``); pass@k too if ``num_samples > 1``."""
    prompts = list(dataset["prompt"])
    greedy = generate(model, tokenizer, prompts, max_new_tokens, batch_size=batch_size)
    sampled = None
    if num_samples > 1:
        sampled = generate(
            model,
            tokenizer,
            prompts,
            max_new_tokens,
            do_sample=True,
            temperature=temperature,
            num_return_sequences=num_samples,
            batch_size=batch_size,
        )
    return grade_generations(dataset, task, greedy, sampled, gold_column)
