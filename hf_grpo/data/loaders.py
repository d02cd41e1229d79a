"""Load a math dataset into the two columns GRPO needs: ``prompt`` and the gold ``solution``.

``DataArguments`` extends ``trl.ScriptArguments`` (``dataset_name``, ``dataset_config``, splits) with what a math
recipe needs: which columns hold the problem and the gold answer, how to turn a problem into a prompt, which grader
applies, and how many rows to use. Known datasets have presets, so ``dataset_name: gsm8k`` is enough:

=====================  ============================  ========  ========================  ====================
name (alias)           hub id                        task      problem / gold columns    splits
=====================  ============================  ========  ========================  ====================
``arithmetic``         (embedded, generated)         gsm8k     question / answer         train / test
``gsm8k``              openai/gsm8k (``main``)       gsm8k     question / answer         train / test
``math``               DigitalLearningGmbH/MATH-lighteval  math  problem / solution     train / test
``math500``            HuggingFaceH4/MATH-500        math      problem / answer          test
``openmathinstruct2``  nvidia/OpenMathInstruct-2     math      problem / expected_answer  train (and train_1M...)
=====================  ============================  ========  ========================  ====================

Any other hub id works with explicit ``prompt_column`` / ``solution_column`` / ``task``; a local ``.jsonl``,
``.json``, ``.parquet`` or ``.csv`` file goes through the matching ``datasets`` builder.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from datasets import Dataset, DatasetDict, load_dataset
from trl import ScriptArguments

from ..rewards.grading import TASKS, gsm8k_gold
from . import arithmetic


logger = logging.getLogger(__name__)

PRESETS = {
    "arithmetic": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    "openai/gsm8k": {"config": "main", "task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    "DigitalLearningGmbH/MATH-lighteval": {"task": "math", "prompt_column": "problem", "solution_column": "solution"},
    "HuggingFaceH4/MATH-500": {
        "task": "math",
        "prompt_column": "problem",
        "solution_column": "answer",
        "train_split": "test",
    },
    "nvidia/OpenMathInstruct-2": {
        "task": "math",
        "prompt_column": "problem",
        "solution_column": "expected_answer",
        "test_split": None,
    },
}
ALIASES = {
    "gsm8k": "openai/gsm8k",
    "math": "DigitalLearningGmbH/MATH-lighteval",
    "math500": "HuggingFaceH4/MATH-500",
    "openmathinstruct2": "nvidia/OpenMathInstruct-2",
}
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}

# Seed 002's r1_zero protocol: a plain-text prompt that opens the <think> block for the model.
R1_ZERO_TEMPLATE = (
    "The user asks a math question. The assistant reasons inside <think> </think> tags, then gives only the final "
    "answer inside <answer> </answer> tags.\nUser: {question}\nAssistant: <think>"
)
PROMPT_STYLES = ("chat", "plain", "r1_zero")


@dataclass
class DataArguments(ScriptArguments):
    """
    Dataset options (extends [`trl.ScriptArguments`]).

    Args:
        dataset_name (`str`, defaults to `"arithmetic"`):
            Preset name (`arithmetic`, `gsm8k`, `math`, `math500`, `openmathinstruct2`), a hub id, or a local
            `.jsonl` / `.json` / `.parquet` / `.csv` file.
        task (`str`, *optional*):
            Grader for the gold answers: `gsm8k` (number after `####`) or `math` (last `\\boxed{}`, math-verify).
            Defaults to the preset's.
        prompt_column (`str`, *optional*):
            Column holding the problem text. Defaults to the preset's.
        solution_column (`str`, *optional*):
            Column holding the gold answer. Defaults to the preset's.
        prompt_template (`str`, defaults to `"{question}"`):
            Format string turning the problem into the user message; `{question}` is replaced by the problem.
        prompt_style (`str`, defaults to `"chat"`):
            `chat` (a conversational prompt rendered by the tokenizer's chat template), `plain` (the formatted text as
            is) or `r1_zero` (seed 002's plain-text prompt that opens a `<think>` block).
        system_prompt (`str`, *optional*):
            System message prepended to chat prompts.
        eval_split_size (`float`, defaults to `0.0`):
            Fraction of the train split held out for evaluation when the dataset has no test split.
        max_train_samples (`int`, *optional*):
            Use at most this many training rows (after shuffling with the run seed).
        max_eval_samples (`int`, *optional*):
            Use at most this many evaluation rows.
        arithmetic_train_size (`int`, defaults to `4000`):
            Number of embedded training problems (`dataset_name: arithmetic` only).
        arithmetic_eval_size (`int`, defaults to `200`):
            Number of embedded held-out problems (`dataset_name: arithmetic` only).
    """

    dataset_name: str | None = field(
        default="arithmetic",
        metadata={"help": "Preset name, hub id or local .jsonl/.json/.parquet/.csv file."},
    )
    task: str | None = field(default=None, metadata={"help": "Grader: `gsm8k` or `math`. Defaults to the preset's."})
    prompt_column: str | None = field(default=None, metadata={"help": "Column holding the problem text."})
    solution_column: str | None = field(default=None, metadata={"help": "Column holding the gold answer."})
    prompt_template: str = field(
        default="{question}", metadata={"help": "Format string for the user message; `{question}` is the problem."}
    )
    prompt_style: str = field(
        default="chat", metadata={"help": "`chat`, `plain` or `r1_zero`.", "choices": PROMPT_STYLES}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message prepended to chat prompts."})
    eval_split_size: float = field(
        default=0.0, metadata={"help": "Fraction of train held out for evaluation when there is no test split."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Cap on the number of training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Cap on the number of evaluation rows."})
    arithmetic_train_size: int = field(default=4000, metadata={"help": "Embedded training problems."})
    arithmetic_eval_size: int = field(default=200, metadata={"help": "Embedded held-out problems."})

    def resolved(self) -> dict:
        """Preset values merged with explicit ones: hub id, config, task, columns and splits."""
        name = ALIASES.get(self.dataset_name, self.dataset_name)
        preset = PRESETS.get(name, {})
        return {
            "name": name,
            "config": self.dataset_config or preset.get("config"),
            "task": self.task or preset.get("task"),
            "prompt_column": self.prompt_column or preset.get("prompt_column"),
            "solution_column": self.solution_column or preset.get("solution_column"),
            "train_split": preset.get("train_split", self.dataset_train_split),
            "test_split": preset.get("test_split", self.dataset_test_split),
        }


def is_local_file(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in LOCAL_BUILDERS


def format_prompt(question: str, args: DataArguments):
    """The prompt for one problem, in the style the recipe asks for."""
    text = args.prompt_template.format(question=question)
    if args.prompt_style == "r1_zero":
        return R1_ZERO_TEMPLATE.format(question=text)
    if args.prompt_style == "plain":
        return text
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    return messages + [{"role": "user", "content": text}]


def _raw_splits(args: DataArguments, seed: int) -> tuple[Dataset, Dataset | None]:
    spec = args.resolved()
    name = spec["name"]
    if name == "arithmetic":
        train = Dataset.from_list(arithmetic.make_split("train", args.arithmetic_train_size, seed))
        test = Dataset.from_list(arithmetic.make_split("test", args.arithmetic_eval_size, seed))
        return train, test
    if is_local_file(name):
        if not os.path.exists(name):
            raise FileNotFoundError(f"dataset_name: local file {name!r} does not exist")
        builder = LOCAL_BUILDERS[os.path.splitext(name)[1].lower()]
        return load_dataset(builder, data_files=name, split="train"), None
    loaded = load_dataset(name, spec["config"], streaming=args.dataset_streaming)
    if not isinstance(loaded, DatasetDict):
        return loaded, None
    if spec["train_split"] not in loaded:
        raise ValueError(
            f"dataset {name!r} has no split {spec['train_split']!r} (it has {sorted(loaded)}); "
            "set dataset_train_split to one of them"
        )
    test_split = spec["test_split"]
    test = loaded[test_split] if test_split and test_split in loaded and test_split != spec["train_split"] else None
    return loaded[spec["train_split"]], test


def _to_grpo(raw: Dataset, args: DataArguments, where: str) -> Dataset:
    spec = args.resolved()
    for key in ("prompt_column", "solution_column"):
        column = spec[key]
        if column is None:
            raise ValueError(f"{key} is not set and {spec['name']!r} has no preset; set {key} in the recipe")
        if column not in raw.column_names:
            raise ValueError(
                f"{key}: column {column!r} is not in the {where} data (columns: {raw.column_names}); "
                f"set {key} to one of them"
            )
    prompts, solutions, dropped = [], [], []
    for row in raw:
        gold = str(row[spec["solution_column"]])
        readable = gsm8k_gold(gold) is not None if spec["task"] == "gsm8k" else bool(gold.strip())
        if not readable:
            dropped.append(gold)
            continue
        prompts.append(format_prompt(str(row[spec["prompt_column"]]), args))
        solutions.append(gold)
    if dropped:
        logger.warning(
            "%s data: dropped %d of %d rows whose gold answer cannot be graded as %s (first: %r)",
            where,
            len(dropped),
            len(raw),
            spec["task"],
            dropped[0][:200],
        )
    if not prompts:
        raise ValueError(f"{where} data: no row has a gold answer gradable as task={spec['task']!r}")
    return Dataset.from_dict({"prompt": prompts, "solution": solutions})


def load_grpo_datasets(args: DataArguments, seed: int = 0) -> tuple[Dataset, Dataset | None]:
    """Train and eval datasets with columns ``prompt`` and ``solution``; eval is None when there is none."""
    task = args.resolved()["task"]
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}; set task in the recipe")
    train, test = _raw_splits(args, seed)
    if test is None and args.eval_split_size > 0:
        parts = train.train_test_split(test_size=args.eval_split_size, seed=seed)
        train, test = parts["train"], parts["test"]
    train = _to_grpo(train, args, "train")
    test = _to_grpo(test, args, "eval") if test is not None else None
    if args.max_train_samples is not None and len(train) > args.max_train_samples:
        train = train.shuffle(seed=seed).select(range(args.max_train_samples))
    if test is not None and args.max_eval_samples is not None and len(test) > args.max_eval_samples:
        test = test.select(range(args.max_eval_samples))
    return train, test
