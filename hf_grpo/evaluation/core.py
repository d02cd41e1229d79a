"""Generate answers for a prompt dataset with transformers and grade them.

The evaluation the training run records as ``eval_results.json`` and ``python -m hf_grpo.evaluate`` reports:
greedy pass@1 (sampled pass@k when ``num_samples > 1``), with the counts of correct, wrong and unparseable answers
from ``hf_grpo.rewards.grade``, prompts rendered as GRPOTrainer renders them. Grading runs in a
``hf_grpo.rewards.wrapper.RewardPool`` with a hard per-completion timeout (``grade_bounded``), which adds the
grades ``timeout`` and ``error`` (``EVAL_GRADES``). Details: docs/grading.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from ..base.progress import progress_bar
from ..base.stopping import raise_if_stopped
from ..base.workers import Result, cores_per_process
from ..rewards import RewardArguments
from ..rewards.functions import GRADED_REWARDS, grade_completion
from ..rewards.grading import GRADES
from ..rewards.wrapper import RewardPool
from .stats import EVAL_GRADES


logger = logging.getLogger(__name__)

DEFAULT_GRADE_TIMEOUT = RewardArguments.reward_timeout  # seconds per completion, as a recipe's reward_timeout
MAX_GRADE_WORKERS = 4  # workers of a pool started for grading (fewer when the machine or the batch is smaller)
GRADE_PROGRESS_SLICE = 64  # least completions graded per pool.map call while a progress bar is shown


@dataclass(kw_only=True)
class EvalResult:
    """Aggregate result of one evaluation; ``records`` holds one dict per example.

    ``timeout`` and ``error`` count the problems whose grading timed out or failed (see the module docstring); they
    are not correct, so ``correct + wrong + unparseable + timeout + error == total``.
    """

    accuracy: float
    correct: int
    wrong: int
    unparseable: int
    timeout: int = 0
    error: int = 0
    total: int
    num_samples: int = 1
    pass_at_k: float | None = None
    records: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("records")
        return out


def prompt_token_ids(tokenizer, prompt, chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of a prompt exactly as TRL's GRPOTrainer builds them (``_tokenize_prompts``): text through the
    tokenizer with its special tokens (a Llama or Gemma tokenizer adds BOS), a message list through the chat template
    with the generation prompt and the recipe's ``chat_template_kwargs`` (``enable_thinking: false``, ...)."""
    if isinstance(prompt, str):
        return list(tokenizer(text=prompt)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        conversation=[prompt],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **(chat_template_kwargs or {}),
    )
    return list(rendered["input_ids"][0])


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
    progress: bool | None = False,
    desc: str = "generating",
    chat_template_kwargs: dict | None = None,
    halve_on_oom: bool = True,
) -> list[list[str]]:
    """Completions for each prompt (``num_return_sequences`` each), decoded without special tokens; prompts are
    tokenized as training tokenizes them (``prompt_token_ids``). The model generates where its parameters are.

    ``progress``: the count of prompts done, batch by batch, with the rate and the time left (off by default; None =
    automatic: a bar on a terminal or in a notebook, else a log line now and then; True = a bar; as in
    ``hf_grpo.base.progress``). ``halve_on_oom``: a batch the accelerator has no memory for is halved (with a warning) and
    generation goes on with the smaller batch; off where processes must generate in step (ZeRO-3, FSDP).
    """
    was_training = model.training
    model.eval()
    outputs: list[list[str]] = []
    options = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature)
    with progress_bar(len(prompts), desc, enabled=progress, unit="problem", leave=False, log_lines=True) as bar:
        start = 0
        while start < len(prompts):
            raise_if_stopped()  # a stop signal that a library dropped (hf_grpo.base.stopping)
            chunk = [prompt_token_ids(tokenizer, p, chat_template_kwargs) for p in prompts[start : start + batch_size]]
            try:
                texts = _generate_batch(model, tokenizer, chunk, num_return_sequences, **options)
            except torch.OutOfMemoryError:
                if not halve_on_oom or batch_size == 1:
                    raise
                batch_size //= 2
                _free_cached_memory()
                logger.warning("%s: out of accelerator memory; %d problems per batch from here on", desc, batch_size)
                continue
            outputs += [texts[i : i + num_return_sequences] for i in range(0, len(texts), num_return_sequences)]
            start += len(chunk)
            bar.update(len(chunk))
    model.train(was_training)
    return outputs


def _generate_batch(model, tokenizer, chunk: list[list[int]], num_return_sequences: int, **options) -> list[str]:
    """One ``model.generate`` call on the token ids of ``chunk`` (left-padded), on the model's device; the texts."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids in chunk)
    input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, P] left-padded
    attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
    for row, ids in enumerate(chunk):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    generated = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        max_new_tokens=options["max_new_tokens"],
        do_sample=options["do_sample"],
        temperature=options["temperature"] if options["do_sample"] else None,
        top_p=None,
        top_k=None,
        num_return_sequences=num_return_sequences,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # [B * n, P + C]
    return tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)


def _free_cached_memory() -> None:
    """Give the allocator's cached blocks back after an out-of-memory error, so the smaller batch can use them."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def grade_results(
    task: str,
    completions: Sequence,
    golds: Sequence[str],
    timeout: float,
    pool: RewardPool | None = None,
    *,
    progress: bool | None = False,
    desc: str = "grading",
) -> list[Result]:
    """Grade each completion against its gold answer in ``pool``'s workers, at most ``timeout`` seconds each.

    One ``Result`` per completion, in order: ``"ok"`` with the grade as ``value``, ``"timeout"`` or ``"error"`` (a
    value that is not a grade is an error too). Without ``pool`` a pool of at most ``MAX_GRADE_WORKERS`` workers is
    started for this call and closed after it. Timeouts and errors are logged (one warning each per call). Raises
    ``ValueError`` for an unknown ``task`` or lengths that differ, ``RuntimeError`` if no worker can start.
    ``progress``: a bar counting the graded completions (off by default; see ``generate``).
    """
    tasks = sorted(set(GRADED_REWARDS.values()))
    if task not in tasks:
        raise ValueError(f"unknown grading task {task!r}; expected one of {tasks}")
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
    if not completions:
        return []
    job = functools.partial(grade_completion, task)
    items = [{"completion": c, "gold": g} for c, g in zip(completions, golds, strict=True)]
    with progress_bar(len(items), desc, enabled=progress, unit="completion", leave=False) as bar:
        workers = min(cores_per_process(), MAX_GRADE_WORKERS, len(items))
        with RewardPool(num_workers=workers) if pool is None else contextlib.nullcontext(pool) as grading:
            results = _map(grading, job, items, timeout, bar)
    results = [
        r if not r.ok or r.value in GRADES else Result("error", error=f"ValueError: unknown grade {r.value!r:.100}")
        for r in results
    ]
    _report(results, completions, timeout)
    return results


def _map(pool: RewardPool, job, items: list[dict], timeout: float, bar) -> list[Result]:
    """``pool.map(job, items, timeout)``; under a bar that is shown, slice by slice so that the bar moves (a slice's
    slowest item holds up the next slice: slices are large enough to keep every worker busy meanwhile)."""
    if bar.disable:
        return pool.map(job, items, timeout)
    size = max(GRADE_PROGRESS_SLICE, pool.num_workers * pool.max_chunk)
    results: list[Result] = []
    for start in range(0, len(items), size):
        results += pool.map(job, items[start : start + size], timeout)
        bar.update(len(items[start : start + size]))
    return results


def grade_of(result: Result) -> str:
    """The evaluation grade of a ``grade_results`` result: its value, or ``"timeout"`` / ``"error"``."""
    return result.value if result.ok else result.status


def grade_bounded(
    task: str,
    completions: Sequence,
    golds: Sequence[str],
    timeout: float = DEFAULT_GRADE_TIMEOUT,
    pool: RewardPool | None = None,
) -> list[str]:
    """The grade of each completion (one of ``EVAL_GRADES``), graded in worker processes with a hard timeout.

    The bounded counterpart of ``[grade_completion(task, c, gold) for ...]``: a completion that takes longer than
    ``timeout`` seconds is ``"timeout"``, one whose grading raises is ``"error"``; see ``grade_results``.
    """
    return [grade_of(r) for r in grade_results(task, completions, golds, timeout, pool)]


def _snippet(text, limit: int = 120) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _report(results: list[Result], completions: Sequence, timeout: float) -> None:
    timed_out = [c for r, c in zip(results, completions, strict=True) if r.status == "timeout"]
    failed = [(r, c) for r, c in zip(results, completions, strict=True) if r.status == "error"]
    if timed_out:
        logger.warning(
            "grading timed out after %g s on %d of %d completions (graded 'timeout', not correct), e.g. %s",
            timeout,
            len(timed_out),
            len(results),
            _snippet(timed_out[0]),
        )
    if failed:
        result, completion = failed[0]
        logger.warning(
            "grading failed on %d of %d completions (graded 'error', not correct); the first, on %s: %s%s",
            len(failed),
            len(results),
            _snippet(completion),
            result.error,
            f"\n{result.traceback.rstrip()}" if result.traceback else "",
        )


def grade_generations(
    dataset,
    task: str,
    greedy: list[list[str]],
    sampled: list[list[str]] | None = None,
    gold_column: str = "solution",
    *,
    timeout: float = DEFAULT_GRADE_TIMEOUT,
    pool: RewardPool | None = None,
    progress: bool | None = False,
    desc: str = "grading",
) -> EvalResult:
    """Grade generated texts (one greedy completion per problem, optionally k samples) into an EvalResult.

    Every completion is graded in ``pool`` (a pool for this call when None) with at most ``timeout`` seconds each
    (``grade_results``); a record whose grade is ``timeout`` or ``error`` says why in ``grade_error``. ``progress``:
    a bar counting the graded completions (off by default; see ``generate``).
    """
    prompts, golds = list(dataset["prompt"]), list(dataset[gold_column])
    completions = [greedy[i][0] for i in range(len(prompts))]
    all_golds = list(golds)
    if sampled is not None:
        for samples, gold in zip(sampled, golds, strict=True):
            completions += samples
            all_golds += [gold] * len(samples)
    results = grade_results(task, completions, all_golds, timeout, pool, progress=progress, desc=desc)  # once
    offset = len(prompts)  # where the next problem's samples start in ``results``

    records, counts, hits = [], dict.fromkeys(EVAL_GRADES, 0), 0
    for i, (prompt, gold, result) in enumerate(zip(prompts, golds, results[: len(prompts)], strict=True)):
        verdict = grade_of(result)
        counts[verdict] += 1
        record = {"index": i, "prompt": prompt, "gold": gold, "completion": completions[i], "grade": verdict}
        if not result.ok:
            record["grade_error"] = result.error
        if sampled is not None:
            sample_grades = [grade_of(r) for r in results[offset : offset + len(sampled[i])]]
            offset += len(sampled[i])
            record["samples"] = sampled[i]
            record["sample_grades"] = sample_grades
            hits += "correct" in sample_grades
        records.append(record)
    total = len(prompts)
    return EvalResult(
        accuracy=counts["correct"] / total if total else 0.0,
        **counts,
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
    grade_timeout: float = DEFAULT_GRADE_TIMEOUT,
    pool: RewardPool | None = None,
    progress: bool | None = None,
    label: str = "eval",
    chat_template_kwargs: dict | None = None,
    halve_on_oom: bool = True,
) -> EvalResult:
    """Greedy accuracy on ``dataset`` (columns ``prompt`` and ``gold_column``); pass@k too if ``num_samples > 1``.

    Generation runs where the model's parameters are, ``batch_size`` problems at a time (halved on running out of
    accelerator memory unless ``halve_on_oom`` is False: see ``generate``). Grading goes through
    ``grade_generations`` (worker processes of ``pool``, ``grade_timeout`` seconds each). Progress bars count the
    problems generated, then the completions graded, described as ``label`` (``before``, ``step20``...); ``progress``
    None shows them on the main process when stderr is a terminal or in a notebook (else generation logs a line now
    and then), True forces them, False hides them (``hf_grpo.base.progress``).
    """
    prompts = list(dataset["prompt"])
    options = dict(
        batch_size=batch_size, progress=progress, chat_template_kwargs=chat_template_kwargs, halve_on_oom=halve_on_oom
    )
    greedy = generate(model, tokenizer, prompts, max_new_tokens, desc=f"{label}: generate", **options)
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
            desc=f"{label}: sample {num_samples}",
            **options,
        )
    grading = dict(timeout=grade_timeout, pool=pool, progress=progress, desc=f"{label}: grade")
    return grade_generations(dataset, task, greedy, sampled, gold_column, **grading)
