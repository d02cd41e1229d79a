"""Load a math dataset into the two columns GRPO needs: ``prompt`` and the gold ``solution``.

``DataArguments`` extends ``trl.ScriptArguments`` with the problem and gold columns, the prompt format, the grader
(``task``) and the number of rows. Known datasets (``arithmetic``, ``gsm8k``, ``math``, ``math500``,
``openmathinstruct2``) have presets; any other hub id or a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv``
file works with explicit columns. Other columns are kept for the rewards. Presets and rules: docs/data.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import zlib
from dataclasses import dataclass, field

import pyarrow.compute as pc
from datasets import Dataset, LargeList, List, Value, load_dataset
from trl import ScriptArguments

from ..rewards.grading import TASKS, check_gold_format, gsm8k_gold
from .embedded import EMBEDDED, load_embedded
from .files import cache_must_be_writable, is_local_file, load_file


logger = logging.getLogger(__name__)

PRESETS = {
    "arithmetic": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    # held-out only: the training templates, other phrasings and two-step problems (arithmetic.make_transfer_split)
    "arithmetic_transfer": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    # held-out only: those kinds plus three-step and distractor problems (arithmetic.make_reasoning_split)
    "arithmetic_reasoning": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    # train only: four operations, one to three steps, distractors (word_problems.make_train); held-out only: kinds
    # written apart from them (word_problems.make_held_out)
    "word_problems": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
    "word_problems_held_out": {"task": "gsm8k", "prompt_column": "question", "solution_column": "answer"},
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
# Seed 002's r1_zero protocol: a plain-text prompt that opens the <think> block for the model.
R1_ZERO_TEMPLATE = (
    "The user asks a math question. The assistant reasons inside <think> </think> tags, then gives only the final "
    "answer inside <answer> </answer> tags.\nUser: {question}\nAssistant: <think>"
)
PROMPT_STYLES = ("chat", "plain", "r1_zero")
LONG_PROMPTS = ("drop", "truncate_left")  # hf_grpo.data.lengths


@dataclass
class DataArguments(ScriptArguments):
    """
    Dataset options (extends [`trl.ScriptArguments`]).

    Args:
        dataset_name (`str`, defaults to `"arithmetic"`):
            Preset name (`arithmetic`, `gsm8k`, `math`, `math500`, `openmathinstruct2`; `arithmetic_transfer` or
            `eval_dataset_name`), a hub id, or a local `.jsonl` / `.json` / `.parquet` / `.csv` file.
        task (`str`, *optional*):
            Grader for the gold answers: `gsm8k` (number after `####`) or `math` (last `\\boxed{}`, math-verify).
            Defaults to the preset's.
        prompt_column (`str`, *optional*):
            Column holding the problem text. Defaults to the preset's.
        solution_column (`str`, *optional*):
            Column holding the gold answer. Defaults to the preset's.
        prompt_template (`str`, defaults to `"{question}"`):
            Format string turning the problem into the user message; `{question}` is replaced by the problem.
        prompt_template_share (`float`, defaults to `1.0`):
            Share of the training prompts written with `prompt_template`; the others are the problem as written, so
            the policy also learns on prompts without the template's instruction. Held-out prompts always use it.
        prompt_style (`str`, defaults to `"chat"`):
            `chat` (a conversational prompt rendered by the tokenizer's chat template), `plain` (the formatted text as
            is) or `r1_zero` (seed 002's plain-text prompt that opens a `<think>` block).
        system_prompt (`str`, *optional*):
            System message prepended to chat prompts.
        eval_dataset_name (`str`, *optional*):
            Held-out dataset (preset name, hub id or local file) used instead of the dataset's test split, e.g.
            `math500` when training on `math`.
        eval_split_size (`float`, defaults to `0.0`):
            Fraction of the train split held out for evaluation when the dataset has no test split.
        long_prompts (`str`, defaults to `"truncate_left"`):
            What to do with a prompt too long to leave `max_completion_length` tokens in the context
            (`generation.max_model_len`, else the model's `max_position_embeddings`): `truncate_left` (cut its start,
            as TRL's old `max_prompt_length` did: a chat prompt keeps its messages and loses the start of their
            contents, the system prompt's first) or `drop` its row. Counted and logged before training.
        max_train_samples (`int`, *optional*):
            Use at most this many training rows (after shuffling with the run seed).
        max_eval_samples (`int`, *optional*):
            Use at most this many evaluation rows.
        arithmetic_train_size (`int`, defaults to `4000`):
            Number of embedded training problems (`dataset_name: arithmetic` only).
        arithmetic_eval_size (`int`, defaults to `200`):
            Number of embedded held-out problems (`arithmetic`'s test split, or `arithmetic_transfer`: a third the
            training templates, a third other phrasings, a third two-step problems; or `arithmetic_reasoning`: those
            three kinds, three-step and distractor-number problems, a fifth each).
        arithmetic_two_step_share (`float`, defaults to `0.0`):
            Share of the embedded problems (`dataset_name: arithmetic`) with two operations, in the training
            templates' words, their gold answers one worked line per operation.
        word_problems_max_steps (`int`, defaults to `3`):
            Most operations (worked lines) in an embedded `word_problems` training problem, 1 to 3: 1 keeps the
            one-step problems a small base model can already solve now and then (GRPO needs a right answer in some
            of a group's samples to learn from).
        word_problems_named_lines (`bool`, defaults to `False`):
            Whether each worked line of an embedded `word_problems` gold answer names what it counts before its
            equation (`4 bags of 6 marbles: 4 * 6 = 24`, `12 eggs in 3 equal parts: 12 / 3 = 4`); the problems are
            the same either way. What a warm start teaches the model to write.
        word_problems_compare (`bool`, defaults to `False`):
            Whether the embedded `word_problems` training set also holds, after every eleventh story, two people's
            counts compared ("How many more pencils does Ada have than Ben?"), for GRPO only: their `warm_start`
            column is false, so a warm start skips them (it stays the same, draw for draw).
        dataset_mirror (`dict[str, str]`, *optional*):
            Local `.jsonl` / `.json` / `.parquet` / `.csv` files that stand in for hub splits, keyed `<hub id>:<split>`
            (for example `openai/gsm8k:test`). Everything else (presets, columns, which split is the held-out one)
            resolves exactly as for the hub dataset; `--miniature` writes this mapping.
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
    prompt_template_share: float = field(
        default=1.0, metadata={"help": "Share of training prompts with prompt_template; the rest as written."}
    )
    prompt_style: str = field(
        default="chat", metadata={"help": "`chat`, `plain` or `r1_zero`.", "choices": PROMPT_STYLES}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message prepended to chat prompts."})
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Held-out dataset (preset, hub id or local file) instead of the test split."}
    )
    eval_split_size: float = field(
        default=0.0, metadata={"help": "Fraction of train held out for evaluation when there is no test split."}
    )
    long_prompts: str = field(
        default="truncate_left",
        metadata={"help": "Prompts too long for the context: `truncate_left` or `drop`.", "choices": LONG_PROMPTS},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Cap on the number of training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Cap on the number of evaluation rows."})
    arithmetic_train_size: int = field(default=4000, metadata={"help": "Embedded training problems."})
    arithmetic_eval_size: int = field(default=200, metadata={"help": "Embedded held-out problems."})
    arithmetic_two_step_share: float = field(
        default=0.0, metadata={"help": "Share of embedded problems with two operations (0 to 1)."}
    )
    word_problems_max_steps: int = field(
        default=3, metadata={"help": "Most operations in a `word_problems` training problem (1 to 3)."}
    )
    word_problems_named_lines: bool = field(
        default=False,
        metadata={
            "help": "Gold lines of `word_problems` name what they count first: `4 bags of 6 marbles: 4 * 6 = 24`."
        },
    )
    word_problems_compare: bool = field(
        default=False,
        metadata={"help": "`word_problems` adds one comparison of two counts in twelve rows, for GRPO only."},
    )
    dataset_mirror: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "Local files standing in for hub splits, as `{'<hub id>:<split>': path}` (written by --miniature; "
            "also usable for an offline copy). Presets, columns and splits resolve exactly as for the hub."
        },
    )

    def resolved(self, name: str | None = None) -> dict:
        """Preset values merged with explicit ones (hub id, config, task, columns, splits) for ``name``.

        ``name`` defaults to ``dataset_name``; for another dataset (``eval_dataset_name``) explicit columns and
        config apply only when it has no preset.
        """
        own = name is None
        name = ALIASES.get(name or self.dataset_name, name or self.dataset_name)
        preset = PRESETS.get(name, {})
        explicit = own or not preset
        return {
            "name": name,
            "config": (self.dataset_config if own else None) or preset.get("config"),
            "task": self.task or preset.get("task"),
            "prompt_column": (self.prompt_column if explicit else None) or preset.get("prompt_column"),
            "solution_column": (self.solution_column if explicit else None) or preset.get("solution_column"),
            "train_split": preset.get("train_split", self.dataset_train_split),
            "test_split": preset.get("test_split", self.dataset_test_split),
        }


def eval_grader(args: DataArguments) -> str:
    """How held-out completions are graded: the dataset's task, or r1_zero's answer tag when the prompt asks for it.

    The same grader as the recipe's correctness reward, so held-out accuracy measures what training optimizes.
    """
    return "r1_zero" if args.prompt_style == "r1_zero" else args.resolved(args.eval_dataset_name or None)["task"]


def format_prompt(question: str, args: DataArguments):
    """The prompt for one problem, in the style the recipe asks for."""
    text = args.prompt_template.format(question=question)
    if args.prompt_style == "r1_zero":
        return R1_ZERO_TEMPLATE.format(question=text)
    if args.prompt_style == "plain":
        return text
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    return messages + [{"role": "user", "content": text}]


def is_conversation(value) -> bool:
    """Whether ``value`` is a prompt in TRL's conversational format: a list of ``{"role", "content"}`` messages (a text
    role, a content that is not None)."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and m.get("content") is not None for m in value)
    )


def _describe(value) -> str:
    """The type of a prompt value, as an error names it: ``dict with keys ['lang', 'text']``, ``list of str``..."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return f"dict with keys {sorted(value)}"
    if isinstance(value, list):
        kinds = sorted({"message" if is_conversation([v]) else type(v).__name__ for v in value})
        return f"list of {', '.join(kinds)}" if value else "empty list"
    return type(value).__name__


def _is_text(feature) -> bool:
    return isinstance(feature, Value) and feature.dtype in ("string", "large_string")


def _valid_without_rows(raw: Dataset, column: str) -> bool:
    """Whether the column's type alone shows every prompt valid: a string column without nulls, or a list of
    ``{role: string, content}`` structs without a null or an empty list (no Python per row, for millions of rows).
    Counts the stored table, a superset of the rows of a split. A ``Json`` column (a list of mixed objects) is not."""
    feature, values = raw.features[column], raw.data.column(column)
    if _is_text(feature):
        return values.null_count == 0
    message = feature.feature if isinstance(feature, (List, LargeList)) else None
    chat = isinstance(message, dict) and _is_text(message.get("role")) and isinstance(message.get("content"), Value)
    if not chat or values.null_count:
        return False
    messages = pc.list_flatten(values)  # a JSON file's rows share one struct: a missing key is a null
    if messages.null_count or any(pc.struct_field(messages, key).null_count for key in ("role", "content")):
        return False
    return len(values) == 0 or pc.min(pc.list_value_length(values)).as_py() > 0


def check_prompts(raw: Dataset, column: str, where: str, name: str) -> None:
    """``ValueError`` naming the column, the first bad row and its type unless every prompt is a string or a list of
    chat messages (TRL's formats); anything else would be stringified into the prompt."""
    if _valid_without_rows(raw, column):
        return
    for row, value in _column_values(raw, column):
        if not isinstance(value, str) and not is_conversation(value):
            raise ValueError(
                f"{where} data {name!r}: prompt_column {column!r}, row {row}: the prompt is a "
                f"{_describe(value)}; a prompt must be a string or a list of chat messages "
                "({'role': ..., 'content': ...}): set prompt_column to such a column or convert the data"
            )


def _column_values(raw: Dataset, column: str):
    """``(row, value)`` of every row of one column, read in batches."""
    rows = raw.select_columns([column]).iter(batch_size=10_000)
    for start, batch in zip(range(0, len(raw), 10_000), rows, strict=False):
        yield from enumerate(batch[column], start)


def _checked_prompts(raw: Dataset, spec: dict, where: str) -> Dataset:
    """``raw`` with its prompts checked (``check_prompts``) and without the rows whose prompt has no text (an empty or
    whitespace-only string, or chat messages whose contents all are), said in a warning with their count;
    ``ValueError`` when no prompt is left. Rows are named by their place in ``raw``: called on a file as read, before
    any split or shuffle, a row number is the file's. ``spec``'s columns are resolved (``_with_columns``)."""
    column, name = spec["prompt_column"], spec["name"]
    check_prompts(raw, column, where, name)
    blank = []
    for row, value in _column_values(raw, column):
        text = value if isinstance(value, str) else "".join(str(m.get("content") or "") for m in value)
        if not text.strip():
            blank.append(row)
    if not blank:
        return raw
    if len(blank) == len(raw):
        raise ValueError(
            f"{where} data {name!r}: prompt_column {column!r} is empty in every row; set it to the column of the "
            "questions"
        )
    logger.warning(
        "%s data %r: dropped %d of %d rows whose prompt (column %r) is empty or only whitespace (first: row %d)",
        where,
        name,
        len(blank),
        len(raw),
        column,
        blank[0],
    )
    return raw.select(sorted(set(range(len(raw))) - set(blank)))


def _load_raw(name: str, config: str | None, split: str, args: DataArguments, seed: int) -> Dataset:
    """One split of a preset, hub or local dataset, unformatted."""
    if name in EMBEDDED:
        return load_embedded(name, split, args, seed)
    mirror = (args.dataset_mirror or {}).get(f"{name}:{split}")
    if mirror is not None:  # a local copy of this hub split (same schema), e.g. a miniature's
        return load_file(mirror)
    if is_local_file(name):
        if not os.path.exists(name):
            raise FileNotFoundError(f"dataset file {name!r} does not exist")
        return load_file(name)
    try:
        with cache_must_be_writable():
            return load_dataset(name, config, split=split)
    except ValueError as exc:  # unknown split: datasets names the available ones
        raise ValueError(f"dataset {name!r} (config {config!r}) has no split {split!r}: {exc}") from None


def source_splits(args: DataArguments) -> dict[str, tuple[dict, str]]:
    """Which dataset split each role reads: ``{"train": (spec, split), "eval": (spec, split)}``.

    ``eval`` is absent when the held-out rows are carved out of train (``eval_split_size``) or there are none. This is
    the one place that decides it; ``load_grpo_datasets`` and ``--miniature`` (which mirrors these splits locally)
    both use it.
    """
    spec = args.resolved()
    sources = {"train": (spec, spec["train_split"])}
    if args.eval_dataset_name:
        eval_spec = args.resolved(args.eval_dataset_name)
        sources["eval"] = (eval_spec, eval_spec["test_split"])
    elif args.eval_split_size > 0:
        pass  # carved out of train (load_grpo_datasets): the recipe asks for it, over a test split it may not have
    elif spec["name"] == "arithmetic":
        sources["eval"] = (spec, "test")
    elif not is_local_file(spec["name"]) and spec["test_split"] and spec["test_split"] != spec["train_split"]:
        sources["eval"] = (spec, spec["test_split"])
    return sources


TRL_COLUMNS = {"prompt_column": "prompt", "solution_column": "solution"}  # what a TRL-format dataset calls them
GOLD_SAMPLE = 200  # gold answers checked against the task's format (check_gold_format)


def _with_columns(raw: Dataset, spec: dict, where: str) -> dict:
    """``spec`` with its prompt and solution columns found in ``raw`` (TRL's names when unset), or a ``ValueError``."""
    spec = dict(spec)
    for key in ("prompt_column", "solution_column"):
        if spec[key] is None and TRL_COLUMNS[key] in raw.column_names:
            spec[key] = TRL_COLUMNS[key]
        column = spec[key]
        if column is None:
            raise ValueError(f"{key} is not set and {spec['name']!r} has no preset; set {key} in the recipe")
        if column not in raw.column_names:
            raise ValueError(
                f"{key}: column {column!r} is not in the {where} data {spec['name']!r} (columns: {raw.column_names}); "
                f"set {key} to one of them"
            )
    return spec


def _to_grpo(raw: Dataset, args: DataArguments, spec: dict, where: str) -> Dataset:
    spec = _with_columns(raw, spec, where)
    prompt_col, gold_col, task = spec["prompt_column"], spec["solution_column"], spec["task"]
    raw = _checked_prompts(raw, spec, where)

    def readable(row) -> bool:
        if row[gold_col] is None:  # a null gold, which str() would make the answer "None"
            return False
        gold = str(row[gold_col])
        return gsm8k_gold(gold) is not None if task == "gsm8k" else bool(gold.strip())

    sample = [str(g) for g in raw.select(range(min(len(raw), GOLD_SAMPLE)))[gold_col] if g is not None]
    mismatch = check_gold_format(task, sample)
    if mismatch is not None:  # a gold column that does not match the task: wrong task or solution_column
        logger.warning(
            "%s data %r, column %r: %s; check task and solution_column", where, spec["name"], gold_col, mismatch
        )
    kept = raw.filter(readable, desc=f"checking {where} gold answers")
    if len(kept) < len(raw):
        example = next(str(r[gold_col]) for r in raw if not readable(r))
        logger.warning(
            "%s data: dropped %d of %d rows whose gold answer cannot be graded as %s (first: %r)",
            where,
            len(raw) - len(kept),
            len(raw),
            task,
            example[:200],
        )
    if len(kept) == 0:
        raise ValueError(f"{where} data: no row has a gold answer gradable as task={task!r}")

    as_written = dataclasses.replace(args, prompt_template="{question}")
    share = args.prompt_template_share if where == "train" else 1.0

    def to_grpo(row) -> dict:
        prompt = row[prompt_col]  # a conversational prompt (TRL's format) is used as it is
        templated = share >= 1 or zlib.crc32(str(prompt).encode()) % 1000 < share * 1000  # the same rows every run
        prompt = prompt if is_conversation(prompt) else format_prompt(str(prompt), args if templated else as_written)
        return {"prompt": prompt, "solution": str(row[gold_col])}

    # The dataset's other columns stay: TRL passes every column to the reward functions (``answer=``, ``level=``...)
    return kept.map(to_grpo, desc=f"formatting {where} prompts")


def without_repeats(test: Dataset) -> Dataset:
    """The held-out rows with each prompt once (the first time it appears): a repeat is graded the same way twice and
    would count twice in every interval (data/held_out.py). How many were dropped is logged."""
    first = {json.dumps(p, sort_keys=True): i for i, p in reversed(list(enumerate(test["prompt"])))}  # each's first
    keep = sorted(first.values())
    if len(keep) == len(test):
        return test
    logger.warning("held-out data: dropped %d of %d rows whose prompt repeats an earlier row's (a repeat would count "
                   "twice in every interval); %d distinct problems are evaluated", len(test) - len(keep), len(test),
                   len(keep))  # fmt: skip
    return test.select(keep)


def load_grpo_datasets(args: DataArguments, seed: int = 0) -> tuple[Dataset, Dataset | None]:
    """Train and eval datasets with columns ``prompt`` and ``solution``; eval is None when there is none."""
    if args.dataset_streaming:
        raise ValueError("dataset_streaming is not supported; use max_train_samples to bound a large dataset")
    task = args.resolved()["task"]
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}; set task in the recipe")
    sources = source_splits(args)
    raw = {role: _load_raw(spec["name"], spec["config"], split, args, seed) for role, (spec, split) in sources.items()}
    train, test = raw["train"], raw.get("eval")
    if test is None and args.eval_split_size > 0:  # rows named by the file's order, not the shuffled split's
        train = _checked_prompts(train, _with_columns(train, args.resolved(), "train"), "train")
        parts = train.train_test_split(test_size=args.eval_split_size, seed=seed)
        train, test = parts["train"], parts["test"]
    train = _to_grpo(train, args, args.resolved(), "train")
    test = _to_grpo(test, args, args.resolved(args.eval_dataset_name or None), "eval") if test is not None else None
    test = without_repeats(test) if test is not None else None
    if args.max_train_samples is not None and len(train) > args.max_train_samples:
        train = train.shuffle(seed=seed).select(range(args.max_train_samples))
    if test is not None and args.max_eval_samples is not None and len(test) > args.max_eval_samples:
        test = test.select(range(args.max_eval_samples))
    return train, test


def load_eval_dataset(args: DataArguments, seed: int = 0, split: str | None = None) -> Dataset:
    """The held-out dataset exactly as ``load_grpo_datasets`` builds it (or ``split`` of ``dataset_name``)."""
    if split is not None:
        spec = args.resolved()
        raw = _load_raw(spec["name"], spec["config"], split, args, seed)
        return _to_grpo(raw, args, spec, f"{split!r} split")
    _, test = load_grpo_datasets(args, seed)
    if test is None:
        raise ValueError(
            f"dataset {args.dataset_name!r} has no held-out split; pass --split, --dataset or eval_split_size"
        )
    return test
