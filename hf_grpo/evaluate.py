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

Progress bars on stderr count the problems generated and the completions graded when stderr is a terminal;
``--progress`` shows them when it is not (a log file), ``--no-progress`` never. The summary on stdout is unchanged.

Bad input (a model path that does not exist, a truncated adapter, a broken recipe or dataset file, an ``--output``
that cannot be written, an unknown split) ends the command with exit status 2 and one line on stderr,
``hf_grpo.evaluate: error: ...``, before any model is loaded. ``--output`` is written to a temporary file next to it
and renamed into place once complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from .launch import apply_thread_policy
from .outputs import RECIPE_FILE
from .rewards import RewardArguments


logger = logging.getLogger("hf_grpo.evaluate")

# hf_grpo.evaluation.core's default, read here without importing torch: bad input fails before the heavy imports
DEFAULT_GRADE_TIMEOUT = RewardArguments.reward_timeout
ERROR_PREFIX = "hf_grpo.evaluate: error:"


def fail(message) -> int:
    """Report a bad input as the module does: one line on stderr, exit status 2."""
    print(f"{ERROR_PREFIX} {' '.join(str(message).split())}", file=sys.stderr)  # noqa: T201
    return 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are the module's one-line errors (exit status 2)."""

    def error(self, message: str):
        self.exit(fail(f"{message} (see python -m hf_grpo.evaluate --help)"))


# ---------------------------------------------------------------------------------------------------------------------
# Input checks: cheap file checks, run before a model or a dataset is loaded. Each raises ValueError (or
# FileNotFoundError) with a message that names the problem and the fix.


def check_model(name: str) -> None:
    """``name`` is a model or adapter directory whose files are whole, or a hub id."""
    path = Path(name).expanduser()
    if not path.exists():
        check_hub_id(name)
        return
    if not path.is_dir():
        raise ValueError(f"{name} is not a directory; pass the directory that holds the model or adapter")
    if (path / "adapter_config.json").is_file():
        check_adapter(path)
    elif (path / "config.json").is_file():
        check_weights(path)
    else:
        raise ValueError(
            f"{name} holds neither config.json nor adapter_config.json; pass a run's output_dir, a saved model or "
            "a LoRA adapter directory"
        )


def check_hub_id(name: str) -> None:
    """``name``, which is no local path, can be a hub model: a valid repo id, and in the hub cache when offline."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        valid = False
    else:
        valid = not name.startswith(("./", "../", "~"))
    if not valid:
        raise FileNotFoundError(f"{name} does not exist; pass a run's output_dir, a model directory or a hub id")
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise FileNotFoundError(
            f"{name} does not exist, and is no model in the hub cache (HF_HUB_OFFLINE is set); pass an existing "
            "directory, or unset HF_HUB_OFFLINE to download it"
        )


def adapter_base(path: Path) -> str:
    """The base model of the LoRA adapter in ``path``: its ``base_model/`` when present, else the one it names."""
    if (path / "base_model").is_dir():
        return str(path / "base_model")
    base = read_adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{path / 'adapter_config.json'} names no base model; put the base model in {path / 'base_model'}"
        )
    return base


def read_adapter_config(path: Path) -> dict:
    config = path / "adapter_config.json"
    try:
        values = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{config} is not valid JSON ({exc}); the adapter was not saved completely: save it again or retrain"
        ) from None
    if isinstance(values, dict):
        return values
    raise ValueError(f"{config} is not a JSON object; save the adapter again or retrain")


def check_adapter(path: Path) -> None:
    read_adapter_config(path)
    if not any((path / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")):
        raise ValueError(f"{path} has adapter_config.json but no adapter_model.safetensors; save the adapter again")
    check_weights(path)
    base = adapter_base(path)
    if Path(base).is_dir():
        check_model(base)


def check_weights(path: Path) -> None:
    """Every ``*.safetensors`` file in ``path`` is as long as its header says (not empty, not cut short)."""
    for file in sorted(path.glob("*.safetensors")):
        expected = safetensors_size(file)
        actual = file.stat().st_size
        if expected != actual:
            raise ValueError(
                f"{file} is empty or truncated ({actual} bytes"
                + (f", its header says {expected})" if expected else ")")
                + "; the save was interrupted: save it again or retrain"
            )


def safetensors_size(file: Path) -> int | None:
    """The size a safetensors file must have: 8 bytes of header length, the JSON header, the tensor data; None when
    the header cannot be read."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        if size < 8 or 8 + header_length > size:
            return None
        try:
            header = json.loads(f.read(header_length))
            data = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
    return 8 + header_length + data


def check_output(output: str | None) -> None:
    """``--output`` names a file in an existing, writable directory (checked before evaluating, not after)."""
    if output is None:
        return
    path = Path(output)
    if path.is_dir():
        raise ValueError(f"--output {output} is a directory; pass a file path, e.g. {path / 'records.jsonl'}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--output {output}: directory {folder} does not exist; create it or pass another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: directory {folder} is not writable; pass another path")


def write_records(output: str, records: list[dict]) -> None:
    """One JSON line per problem, written to a temporary file next to ``output`` and renamed into place."""
    path = Path(output)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def check_data_file(name: str | None) -> None:
    """A local dataset file is not empty, and each line of a ``.jsonl`` file is a JSON object."""
    from .data.loaders import is_local_file

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


def check_split(data, split: str | None) -> None:
    """``split`` exists in the dataset, checked before the model loads: a local file is read whole (as ``train``), so
    an unknown split would otherwise pass silently, and the loader's own error for arithmetic comes after loading."""
    from .data.loaders import is_local_file

    if split is None:
        return
    name = data.resolved()["name"]
    if name == "arithmetic":
        available = ["train", "test"]
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


def find_recipe(path: Path) -> Path | None:
    for folder in (path, path.parent):
        if (folder / RECIPE_FILE).is_file():
            return folder / RECIPE_FILE
    return None


def recipe_values(recipe: Path | None) -> dict:
    """The settings of ``recipe`` ({} for none); ValueError for a file that is not a YAML mapping."""
    if recipe is None:
        return {}
    import yaml

    from .recipe import load_yaml

    if not recipe.is_file():
        raise FileNotFoundError(f"recipe {recipe} does not exist; pass an existing file to --recipe")
    try:
        with open(recipe) as f:
            values = load_yaml(f)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)  # where the parser gave up, for a syntax error
        problem = f"line {mark.line + 1}: {exc.problem}" if mark is not None else str(exc)
        raise ValueError(
            f"recipe {recipe} is not valid YAML ({problem}); fix it, or pass another with --recipe"
        ) from None
    if values is None:
        return {}
    if isinstance(values, dict):
        return {k: v for k, v in values.items() if isinstance(k, str)}
    raise ValueError(
        f"recipe {recipe} holds a {type(values).__name__}, not a mapping of settings; fix it, or pass another with "
        "--recipe"
    )


def load_model(name: str, trust_remote_code: bool = False):
    """(model, tokenizer) for a model id/dir or a LoRA adapter dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(name)
    if (path / "adapter_config.json").is_file():
        from peft import PeftModel

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
    from vllm import LLM, SamplingParams
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


def positive_int(text: str) -> int:
    """argparse type of the counts (``--max-samples``, ``--num-samples``...): a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
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
    p = ArgumentParser(prog="python -m hf_grpo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("model", help="model id or directory, or a LoRA adapter directory (e.g. a run's output_dir)")
    p.add_argument("--recipe", help="take dataset, prompts and budget from this recipe (default: the run's own)")
    p.add_argument("--dataset", help="preset (arithmetic, gsm8k, math, math500, openmathinstruct2), hub id or file")
    p.add_argument("--split", help="split to evaluate (default: the dataset's held-out split)")
    p.add_argument("--task", choices=["gsm8k", "math"], help="grader (default: the dataset's)")
    p.add_argument("--prompt-column")
    p.add_argument("--solution-column")
    p.add_argument("--prompt-style", choices=["chat", "plain", "r1_zero"])
    p.add_argument("--prompt-template")
    p.add_argument("--max-samples", type=positive_int, help="evaluate the first N problems only")
    p.add_argument("--max-new-tokens", type=positive_int)
    p.add_argument("--num-samples", type=positive_int, default=1, help="k for pass@k (sampled), besides greedy pass@1")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k")
    p.add_argument("--batch-size", type=positive_int, help="generation batch (default: the training run's, else 8)")
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
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bars on stderr for generation and grading (default: only when stderr is a terminal)",
    )
    return p.parse_args(argv)


def eval_dataset(data, seed: int, split: str | None):
    """The problems to evaluate, as ``load_eval_dataset`` builds them, after the checks it does not make."""
    from datasets.exceptions import DatasetGenerationError

    from .data.loaders import load_eval_dataset

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


def evaluate_run(model: str, args: argparse.Namespace | None = None, **overrides):
    """Evaluate ``model`` (a run's output_dir, a base model or an adapter dir) and return the ``EvalResult``.

    ``overrides`` are the command-line options by their Python names (``dataset="math500"``, ``num_samples=8``).
    Raises ``ValueError`` / ``FileNotFoundError`` for a model, recipe or dataset that cannot be loaded.
    """
    from .data.loaders import DataArguments, eval_grader

    if args is None:
        args = parse_args([model])
    for key, value in overrides.items():
        setattr(args, key, value)
    check_model(args.model)
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
    dataset = eval_dataset(data, seed, args.split)
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
        return grade_generations(
            dataset, task, texts, sampled, timeout=timeout, progress=args.progress, desc="evaluate: grade"
        )
    import torch

    from .evaluation.core import evaluate

    torch.manual_seed(seed)
    try:
        model_obj, tokenizer = load_model(args.model, trust_remote_code=args.trust_remote_code)
    except OSError as exc:  # transformers' error for a hub id it cannot find or download
        raise ValueError(f"cannot load model {args.model}: {exc}") from None
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
        progress=args.progress,
        label="evaluate",
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = parse_args(argv)
    try:
        check_output(args.output)  # before evaluating: a bad --output must not cost the results
        check_model(args.model)  # (evaluate_run checks it too) before torch is imported
        apply_thread_policy()  # the same per-process thread count as training, so the same numbers
        result = evaluate_run(args.model, args)
    except (ValueError, FileNotFoundError) as exc:
        return fail(exc)
    if args.output:
        write_records(args.output, result.records)
    print(json.dumps(result.summary(), indent=2))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
