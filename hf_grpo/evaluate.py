"""Evaluate a model or a LoRA adapter on a math dataset: greedy pass@1, sampled pass@k, correct / wrong / unparseable.

    python -m hf_grpo.evaluate outputs/tiny                        # the trained adapter, on the run's held-out split
    python -m hf_grpo.evaluate outputs/tiny/base_model             # the same split, before GRPO
    python -m hf_grpo.evaluate Qwen/Qwen2.5-Math-1.5B --dataset math500 --prompt-style r1_zero --max-new-tokens 1024
    python -m hf_grpo.evaluate outputs/run --num-samples 8 --temperature 1.0 --output per_example.jsonl

A directory with ``adapter_config.json`` is loaded as base model + adapter (the base is ``base_model/`` next to the
adapter when it exists, else the adapter's ``base_model_name_or_path``). When the directory, or its parent, holds
the ``recipe.yaml`` of a training run, the dataset, prompt format and generation budget default to the run's, so
the numbers match the run's ``eval_results.json``. Grading goes through ``hf_grpo.rewards.grade``, in worker
processes with a hard per-completion timeout (``--grade-timeout``; default: the recipe's ``reward_timeout``, else
10 s): a completion the grader cannot finish with is counted as ``timeout`` (not correct) and the evaluation goes on;
one whose grading fails is counted as ``error`` (``hf_grpo.evaluation.core``).

``--backend vllm`` generates with vLLM's offline engine (GPU machines with ``hf_grpo[vllm]``); the default
``transformers`` backend runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .data.loaders import DataArguments, eval_grader, load_eval_dataset
from .evaluation.core import DEFAULT_GRADE_TIMEOUT, evaluate
from .launch import apply_thread_policy
from .outputs import RECIPE_FILE


logger = logging.getLogger("hf_grpo.evaluate")


def find_recipe(path: Path) -> Path | None:
    for folder in (path, path.parent):
        if (folder / RECIPE_FILE).is_file():
            return folder / RECIPE_FILE
    return None


def recipe_values(recipe: Path | None) -> dict:
    if recipe is None:
        return {}
    from .recipe import load_yaml

    with open(recipe) as f:
        return {k: v for k, v in (load_yaml(f) or {}).items() if isinstance(k, str)}


def load_model(name: str, trust_remote_code: bool = False):
    """(model, tokenizer) for a model id/dir or a LoRA adapter dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(name)
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        from peft import PeftModel

        base = path / "base_model"
        if not base.is_dir():
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
            if not base:
                raise ValueError(f"{adapter} names no base model; pass the base with --base-model")
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
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    path = Path(name)
    adapter = path / "adapter_config.json"
    lora = None
    if adapter.is_file():
        base = path / "base_model"
        base = str(base) if base.is_dir() else json.loads(adapter.read_text())["base_model_name_or_path"]
        rank = json.loads(adapter.read_text())["r"]
        llm = LLM(model=base, enable_lora=True, max_lora_rank=max(8, rank), seed=seed)
        lora = LoRARequest("adapter", 1, str(path))
    else:
        llm = LLM(model=name, seed=seed)
    params = SamplingParams(
        n=num_samples, max_tokens=max_new_tokens, temperature=temperature if num_samples > 1 else 0
    )
    if prompts and not isinstance(prompts[0], str):
        outputs = llm.chat(prompts, params, lora_request=lora)
    else:
        outputs = llm.generate(prompts, params, lora_request=lora)
    return [[o.text for o in out.outputs] for out in outputs]


def positive_seconds(text: str) -> float:
    """argparse type of ``--grade-timeout``: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def grade_timeout(args: argparse.Namespace, values: dict) -> float:
    """Seconds per completion for grading: ``--grade-timeout``, else the recipe's ``reward_timeout``, else 10."""
    if args.grade_timeout is not None:
        return args.grade_timeout
    if values.get("reward_timeout") is None:
        return DEFAULT_GRADE_TIMEOUT
    try:
        return positive_seconds(str(values["reward_timeout"]))
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"recipe reward_timeout {values['reward_timeout']!r}: {exc}; pass --grade-timeout") from None


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m hf_grpo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("model", help="model id or directory, or a LoRA adapter directory (e.g. a run's output_dir)")
    p.add_argument("--recipe", help="take dataset, prompts and budget from this recipe (default: the run's own)")
    p.add_argument("--dataset", help="preset (arithmetic, gsm8k, math, math500, openmathinstruct2), hub id or file")
    p.add_argument("--split", help="split to evaluate (default: the dataset's held-out split)")
    p.add_argument("--task", choices=["gsm8k", "math"], help="grader (default: the dataset's)")
    p.add_argument("--prompt-column")
    p.add_argument("--solution-column")
    p.add_argument("--prompt-style", choices=["chat", "plain", "r1_zero"])
    p.add_argument("--prompt-template")
    p.add_argument("--max-samples", type=int, help="evaluate the first N problems only")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--num-samples", type=int, default=1, help="k for pass@k (sampled), besides greedy pass@1")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k")
    p.add_argument("--batch-size", type=int, help="generation batch (default: the training run's, else 8)")
    p.add_argument("--seed", type=int)
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--output", help="write one JSON line per problem here")
    p.add_argument(
        "--grade-timeout",
        type=positive_seconds,
        help="seconds one completion may take to grade before it counts as 'timeout' (default: the recipe's "
        f"reward_timeout, else {DEFAULT_GRADE_TIMEOUT:g})",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model (off by default)")
    return p.parse_args(argv)


def evaluate_run(model: str, args: argparse.Namespace | None = None, **overrides):
    """Evaluate ``model`` (a run's output_dir, a base model or an adapter dir) and return the ``EvalResult``.

    ``overrides`` are the command-line options by their Python names (``dataset="math500"``, ``num_samples=8``).
    Raises ``ValueError`` / ``FileNotFoundError`` for a dataset that cannot be loaded.
    """
    if args is None:
        args = parse_args([model])
    for key, value in overrides.items():
        setattr(args, key, value)
    recipe_path = Path(args.recipe) if args.recipe else find_recipe(Path(args.model))
    values = recipe_values(recipe_path)
    data_fields = set(DataArguments.__dataclass_fields__)
    data = DataArguments(**{k: v for k, v in values.items() if k in data_fields})
    for flag, attr in (
        ("dataset", "dataset_name"),
        ("task", "task"),
        ("prompt_column", "prompt_column"),
        ("solution_column", "solution_column"),
        ("prompt_style", "prompt_style"),
        ("prompt_template", "prompt_template"),
    ):
        if getattr(args, flag) is not None:
            setattr(data, attr, getattr(args, flag))
    if args.dataset is not None and args.dataset != values.get("dataset_name"):
        data.eval_dataset_name = None  # an explicit dataset replaces the recipe's held-out one
    seed = args.seed if args.seed is not None else values.get("seed", 0)
    max_new_tokens = (
        args.max_new_tokens or values.get("eval_max_new_tokens") or values.get("max_completion_length") or 256
    )
    dataset = load_eval_dataset(data, seed=seed, split=args.split)
    if args.max_samples is not None:
        dataset = dataset.select(range(min(args.max_samples, len(dataset))))
    task = eval_grader(data)  # the training run's grader: r1_zero's answer tag for an r1_zero prompt
    timeout = grade_timeout(args, values)
    logger.info(
        "evaluating %s on %d problems (task %s, %s)",
        args.model,
        len(dataset),
        task,
        f"recipe {recipe_path}" if recipe_path else "no recipe",
    )
    if args.backend == "vllm":
        from .evaluation.core import grade_generations

        texts = vllm_generate(args.model, list(dataset["prompt"]), max_new_tokens, 1, 0.0, seed)
        sampled = None
        if args.num_samples > 1:
            sampled = vllm_generate(
                args.model, list(dataset["prompt"]), max_new_tokens, args.num_samples, args.temperature, seed
            )
        return grade_generations(dataset, task, texts, sampled, timeout=timeout)
    import torch

    torch.manual_seed(seed)
    model_obj, tokenizer = load_model(args.model, trust_remote_code=args.trust_remote_code)
    batch_size = args.batch_size or max(values.get("per_device_eval_batch_size", 8), 8)  # as TaskEvaluator does
    return evaluate(
        model_obj,
        tokenizer,
        dataset,
        task,
        max_new_tokens,
        num_samples=args.num_samples,
        temperature=args.temperature,
        batch_size=batch_size,
        grade_timeout=timeout,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = parse_args(argv)
    apply_thread_policy()  # the same per-process thread count as training, so the same numbers
    if not Path(args.model).expanduser().exists() and args.model.startswith(("./", "/", "../", "~")):
        print(f"hf_grpo.evaluate: error: {args.model} does not exist", file=sys.stderr)  # noqa: T201
        return 2
    try:
        result = evaluate_run(args.model, args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"hf_grpo.evaluate: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in result.records)
    print(json.dumps(result.summary(), indent=2))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
