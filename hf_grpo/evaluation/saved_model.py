"""Evaluate a saved model or LoRA adapter on a math dataset: the run behind ``python -m hf_grpo.evaluate``.

The device (``--device``, else a CUDA GPU when there is one: ``hf_grpo.evaluation.device``) and the dataset are
checked before the model loads (an empty or broken local file, an unknown split) and the problems without a gold
answer are dropped. The model (base model + adapter for an adapter directory) generates with transformers on that
device, ``eval_batch_size`` problems at a time (halved if the GPU runs out of memory), or with vLLM's offline engine
(``--backend vllm``: GPU machines with ``hf_grpo[vllm]``). Grading goes
through ``hf_grpo.rewards.grade`` in worker processes with a hard per-completion timeout: a completion the grader
cannot finish with counts as ``timeout`` (not correct) and the evaluation goes on; one whose grading fails counts as
``error`` (``hf_grpo.evaluation.core``). Progress bars go to stderr (``--progress``), the summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch
from datasets.exceptions import DatasetGenerationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..data.embedded import EMBEDDED, embedded_splits
from ..data.loaders import DataArguments, eval_grader, is_local_file, load_eval_dataset
from .checks import adapter_base, read_adapter_config
from .core import EvalResult, evaluate, grade_generations
from .device import choose_device, describe, eval_batch_size


logger = logging.getLogger(__name__)

# the command's flags that replace a recipe's data settings of the same name (and --dataset: dataset_name)
DATA_FLAGS = ("task", "prompt_column", "solution_column", "prompt_style", "prompt_template")


def check_data_file(name: str | None) -> None:
    """A local dataset file is not empty, and each line of a ``.jsonl`` file is a JSON object."""
    if name is None or not is_local_file(name) or not os.path.isfile(name):
        return  # a preset or hub dataset; a missing file is the loader's error
    if os.path.getsize(name) == 0:
        raise ValueError(f"dataset file {name} is empty; pass a file with one problem per line")
    if not name.lower().endswith(".jsonl"):
        return
    with open(name, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"dataset file {name}, line {number} is not JSON ({exc}); fix or remove it") from None
            if isinstance(row, dict):
                continue
            raise ValueError(f"dataset file {name}, line {number} is not a JSON object; fix or remove it")


def check_split(data: DataArguments, split: str | None) -> None:
    """``split`` exists in the dataset, checked before the model loads: a local file is read whole (as ``train``), so
    an unknown split would otherwise pass silently, and the loader's own error for arithmetic comes after loading."""
    if split is None:
        return
    name = data.resolved()["name"]
    if name in EMBEDDED:
        available = embedded_splits(name)
    elif is_local_file(name):
        available = ["train"]
    else:
        return  # a hub dataset: the loader's error names the splits it has
    if split not in available:
        raise ValueError(f"dataset {name!r} has no split {split!r}; its splits are {available}: pass one to --split")


def drop_missing_golds(dataset, gold_column: str | None):
    """``dataset`` without the problems whose gold answer is null or empty (a warning gives the count).

    The loader keeps a null MATH gold as the text "None" in ``solution``; the data's own gold column, when it is
    kept beside ``solution``, tells a null from the word.
    """
    if gold_column and gold_column != "solution" and gold_column in dataset.column_names:
        missing = [gold is None or not str(gold).strip() for gold in dataset[gold_column]]
    else:
        missing = [gold is None or str(gold).strip() in ("", "None") for gold in dataset["solution"]]
    if not any(missing):
        return dataset
    if all(missing):
        raise ValueError(
            f"none of the {len(dataset)} problems has a gold answer (all null or empty); check --solution-column"
        )
    logger.warning("dropped %d of %d problems whose gold answer is null or empty", sum(missing), len(dataset))
    return dataset.select([i for i, gone in enumerate(missing) if not gone])


def eval_dataset(data: DataArguments, seed: int, split: str | None):
    """The problems to evaluate, as ``load_eval_dataset`` builds them, after the checks it does not make."""
    name = data.resolved()["name"]
    # a held-out set named by --dataset (arithmetic_transfer, word_problems_held_out) has one split: that one
    if split is None and not data.eval_dataset_name and name in EMBEDDED and embedded_splits(name) == ["test"]:
        split = "test"
    check_split(data, split)
    # without --split the loader reads the training data too (as training does), and the held-out data from it or
    # from eval_dataset_name
    held_out = data.eval_dataset_name if split is None else None
    names = [name for name in (data.dataset_name, held_out) if name]
    for name in names:
        check_data_file(name)
    try:
        dataset = load_eval_dataset(data, seed=seed, split=split)
    except DatasetGenerationError as exc:  # a data file datasets cannot parse: the cause says where
        raise ValueError(f"dataset {' or '.join(names)} cannot be read: {exc.__cause__ or exc}") from None
    return drop_missing_golds(dataset, data.resolved(held_out)["solution_column"])


def data_arguments(args: argparse.Namespace, values: dict) -> DataArguments:
    """The recipe's data settings (``values``), with the command line's flags over them."""
    data_fields = set(DataArguments.__dataclass_fields__)
    data = DataArguments(**{k: v for k, v in values.items() if k in data_fields})
    for flag, attr in [("dataset", "dataset_name"), *((name, name) for name in DATA_FLAGS)]:
        if getattr(args, flag) is not None:
            setattr(data, attr, getattr(args, flag))
    if args.dataset is not None and args.dataset != values.get("dataset_name"):
        data.eval_dataset_name = None  # an explicit dataset replaces the recipe's held-out one
    return data


def load_model(name: str, trust_remote_code: bool = False):
    """(model, tokenizer) for a model id/dir or a LoRA adapter dir."""
    path = Path(name)
    if (path / "adapter_config.json").is_file():
        from peft import PeftModel  # only an adapter needs PEFT

        base = adapter_base(path)
        model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=trust_remote_code)
        model = PeftModel.from_pretrained(model, path)
        tokenizer_source = path if (path / "tokenizer_config.json").is_file() else base
    else:
        model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=trust_remote_code)
        tokenizer_source = name
    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_source, padding_side="left", trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def vllm_generate(name: str, prompts: list, max_new_tokens: int, num_samples: int, temperature: float, seed: int):
    """Completions with vLLM's offline engine (one list of texts per prompt)."""
    from vllm import LLM, SamplingParams  # an optional dependency (hf_grpo[vllm]), for --backend vllm only
    from vllm.lora.request import LoRARequest

    path = Path(name)
    lora = None
    if (path / "adapter_config.json").is_file():
        rank = read_adapter_config(path).get("r", 8)
        llm = LLM(model=adapter_base(path), enable_lora=True, max_lora_rank=max(8, rank), seed=seed)
        lora = LoRARequest("adapter", 1, str(path))
    else:
        llm = LLM(model=name, seed=seed)
    params = SamplingParams(
        n=num_samples, max_tokens=max_new_tokens, temperature=temperature if num_samples > 1 else 0
    )
    run = llm.chat if prompts and not isinstance(prompts[0], str) else llm.generate  # chat: lists of messages
    outputs = run(prompts, params, lora_request=lora)
    return [[o.text for o in out.outputs] for out in outputs]


def evaluate_saved(args: argparse.Namespace, values: dict, recipe: Path | None, timeout: float) -> EvalResult:
    """Evaluate ``args.model`` with the command's options ``args`` over the settings ``values`` of its ``recipe``;
    ``timeout``: seconds to grade one completion. ``ValueError`` for a dataset or model that cannot be loaded."""
    if args.backend == "vllm" and args.device is not None:
        raise ValueError(
            "--device applies to --backend transformers; vLLM generates on the GPUs CUDA_VISIBLE_DEVICES names"
        )
    device = choose_device(args.device) if args.backend == "transformers" else None  # a bad --device: before loading
    data = data_arguments(args, values)
    seed = args.seed if args.seed is not None else values.get("seed", 0)
    max_new_tokens = (
        args.max_new_tokens or values.get("eval_max_new_tokens") or values.get("max_completion_length") or 256
    )
    dataset = eval_dataset(data, seed, args.split)
    if args.max_samples is not None:
        dataset = dataset.select(range(min(args.max_samples, len(dataset))))
    task = eval_grader(data)  # the training run's grader: r1_zero's answer tag for an r1_zero prompt
    where = f"recipe {recipe}" if recipe else "no recipe"
    if args.backend == "vllm":
        logger.info("evaluating %s on %d problems (task %s, %s) with vLLM", args.model, len(dataset), task, where)
        prompts = list(dataset["prompt"])
        texts = vllm_generate(args.model, prompts, max_new_tokens, 1, 0.0, seed)
        sampled = None
        if args.num_samples > 1:
            sampled = vllm_generate(args.model, prompts, max_new_tokens, args.num_samples, args.temperature, seed)
        return grade_generations(
            dataset, task, texts, sampled, timeout=timeout, progress=args.progress, desc="evaluate: grade"
        )
    torch.manual_seed(seed)
    try:
        model, tokenizer = load_model(args.model, trust_remote_code=args.trust_remote_code)
    except OSError as exc:  # transformers' error for a hub id it cannot find or download
        raise ValueError(f"cannot load model {args.model}: {exc}") from None
    batch_size = args.batch_size or eval_batch_size(device, values.get("per_device_eval_batch_size"))  # as in training
    logger.info(
        "evaluating %s on %d problems (task %s, %s) on %s, %d problems per batch",
        args.model,
        len(dataset),
        task,
        where,
        describe(device),
        batch_size,
    )
    model.to(device)
    return evaluate(
        model,
        tokenizer,
        dataset,
        task,
        max_new_tokens,
        num_samples=args.num_samples,
        temperature=args.temperature,
        batch_size=batch_size,
        grade_timeout=timeout,
        progress=args.progress,
        label="evaluate",
        chat_template_kwargs=values.get("chat_template_kwargs"),  # as the run's training rendered its prompts
    )
