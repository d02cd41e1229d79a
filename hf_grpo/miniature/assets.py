"""What a miniature swaps in: a tiny model of the recipe's architecture family and local copies of its datasets.

    spec = AssetSpec(family="qwen2", seed=42, prompt=..., answer_style="gsm8k", splits=(...))
    assets = ensure_assets(spec)          # builds once (under a file lock), then reuses the cache
    assets.model_dir, assets.files        # a from_pretrained directory; {"openai/gsm8k:train": ".../gsm8k-train.jsonl"}

A 2-layer model of the recipe's architecture family with its own tokenizer, warm-started on the miniature's data in
the recipe's prompt and answer format; the data files hold generated arithmetic problems in each dataset's columns.
Cached under ``$HF_GRPO_CACHE/miniature/<key>``. How each is built: docs/recipes.md, "The miniature's assets".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import safetensors.torch
import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM

from ..data.arithmetic import make_split
from ..data.loaders import DataArguments, format_prompt
from ..models.registry import resolve
from ..models.tiny import build_tokenizer
from ..training.warm_start import warm_start


logger = logging.getLogger(__name__)

ASSETS_VERSION = 3  # bump when a builder below changes what it writes
CACHE_ENV = "HF_GRPO_CACHE"
TRAIN_ROWS, EVAL_ROWS = 512, 64
WARM_START_STEPS, WARM_START_LR = 200, 3e-3

# The tiny model: the same architecture family as the recipe's model, sized for a CPU.
TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # heads of 32: vLLM's CPU attention refuses head_dim 16
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,  # a separate lm_head, as in the 7B models: weight sync must carry it
}
# How to recognise a family from a hub id when its config.json cannot be read offline (first match wins).
FAMILY_PATTERNS = (
    ("qwen3", "qwen3"),
    ("qwen", "qwen2"),
    ("llama", "llama"),
    ("mistral", "mistral"),
    ("smollm2", "llama"),
)
DEFAULT_FAMILY = "qwen2"

# Known hub datasets: the columns a miniature copy has, besides the problem and the gold answer.
GSM8K, MATH, MATH500, OPENMATH = (
    "openai/gsm8k",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "nvidia/OpenMathInstruct-2",
)
ANSWER_STYLES = ("gsm8k", "math", "r1_zero")


@dataclass(frozen=True)
class SplitSpec:
    """One hub split to mirror: its role (``train`` or ``eval``), id and split, the recipe's columns and task."""

    role: str
    name: str
    split: str
    prompt_column: str
    solution_column: str
    task: str


@dataclass(frozen=True)
class PromptFormat:
    """The recipe's prompt settings (``DataArguments``) that shape what the warm start trains on."""

    prompt_template: str = "{question}"
    prompt_style: str = "chat"
    system_prompt: str | None = None


@dataclass(frozen=True)
class AssetSpec:
    family: str
    seed: int
    prompt: PromptFormat
    answer_style: str
    splits: tuple[SplitSpec, ...]

    def key(self) -> str:
        text = json.dumps({"version": ASSETS_VERSION, **asdict(self)}, sort_keys=True)
        return f"{self.family}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass
class Assets:
    root: Path
    model_dir: Path
    files: dict[str, str]  # "<hub id>:<split>" -> local file

    def exists(self) -> bool:
        return (self.root / "COMPLETE").is_file()


# ---------------------------------------------------------------------------------------------------------------------
# Architecture family


def architecture_family(name_or_path: str) -> tuple[str, str]:
    """(model_type, how it was found) for a model id, directory or packaged model's name, without any download."""
    config = Path(resolve(name_or_path) or name_or_path).expanduser() / "config.json"
    source = "its config.json"
    if not config.is_file():
        config, source = None, "the hub cache"
        with contextlib.suppress(Exception):  # an id that is not a valid repo name has no cache entry either
            cached = try_to_load_from_cache(name_or_path, "config.json")
            config = Path(cached) if isinstance(cached, str) else None
    if config is not None:
        model_type = json.loads(config.read_text()).get("model_type")
        if model_type:
            return model_type, source
    lowered = name_or_path.lower()
    for pattern, family in FAMILY_PATTERNS:
        if pattern in lowered:
            return family, "its name"
    return DEFAULT_FAMILY, "unknown offline, assumed"


# ---------------------------------------------------------------------------------------------------------------------
# Data


def _problems(role: str, n: int, seed: int) -> list[tuple[str, int, str, int, int]]:
    """(question, a, op, b, result) tuples of the embedded arithmetic generator (disjoint train/held-out questions)."""
    out = []
    for p in make_split("train" if role == "train" else "test", n, seed):
        a, op, b, _, result = p["answer"].splitlines()[0].split()
        out.append((p["question"], int(a), op, int(b), int(result)))
    return out


def gold_text(task: str, a: int, op: str, b: int, r: int) -> str:
    """A gold answer written the way a dataset of ``task`` writes it."""
    if task == "gsm8k":
        return f"{a} {op} {b} = {r}\n#### {r}"
    return f"We compute ${a} {op} {b} = {r}$, so the answer is $\\boxed{{{r}}}$."


def schema_row(split: SplitSpec, index: int, problem: tuple) -> dict:
    """One row with the columns of ``split.name`` (a known dataset) or of the recipe's own columns."""
    question, a, op, b, r = problem
    solution = gold_text("math", a, op, b, r)
    if split.name == GSM8K:
        return {"question": question, "answer": gold_text("gsm8k", a, op, b, r)}
    if split.name == MATH:
        return {"problem": question, "level": "Level 1", "type": "Prealgebra", "solution": solution}
    if split.name == MATH500:
        return {
            "problem": question,
            "solution": solution,
            "answer": str(r),
            "subject": "Prealgebra",
            "level": 1,
            "unique_id": f"test/prealgebra/{index}.json",
        }
    if split.name == OPENMATH:
        return {
            "problem": question,
            "generated_solution": solution,
            "expected_answer": str(r),
            "problem_source": "augmented_gsm8k",
        }
    gold = gold_text("gsm8k", a, op, b, r) if split.task == "gsm8k" else f"\\boxed{{{r}}}"
    return {split.prompt_column: question, split.solution_column: gold}


def file_name(split: SplitSpec) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{split.name}-{split.split}") + ".jsonl"


# ---------------------------------------------------------------------------------------------------------------------
# Answers the warm start teaches


def answer_style(reward_funcs: list[str], task: str, prompt_style: str) -> str:
    """How the recipe's correctness reward reads an answer: ``r1_zero``, ``math`` (a box) or ``gsm8k`` (####)."""
    names = " ".join(reward_funcs)
    if prompt_style == "r1_zero" or "r1_zero" in names:
        return "r1_zero"
    if "math_correctness" in names or (task == "math" and "gsm8k_correctness" not in names):
        return "math"
    return "gsm8k"


def demo_completion(style: str, a: int, op: str, b: int, r: int) -> str:
    """A correct completion in ``style`` (the r1_zero prompt has already opened ``<think>``)."""
    if style == "r1_zero":
        return f" {a} {op} {b} = {r} </think> <answer> {r} </answer>"
    if style == "math":
        return f"{a} {op} {b} = {r}, so the answer is $\\boxed{{{r}}}$."
    return f"{a} {op} {b} = {r}\n#### {r}"


# ---------------------------------------------------------------------------------------------------------------------
# Building


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_grpo").expanduser() / "miniature"


def locate(spec: AssetSpec) -> Assets:
    """Where the assets of ``spec`` are (or will be): known without building them."""
    root = cache_root() / spec.key()
    files = {f"{s.name}:{s.split}": str(root / "data" / file_name(s)) for s in spec.splits}
    return Assets(root=root, model_dir=root / "model", files=files)


def ensure_assets(spec: AssetSpec) -> Assets:
    """Build the assets of ``spec`` unless cached; safe when several processes ask at once (file lock)."""
    assets = locate(spec)
    if assets.exists():
        return assets
    assets.root.parent.mkdir(parents=True, exist_ok=True)
    with open(assets.root.parent / f"{spec.key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not assets.exists():
            staging = assets.root.with_name(f"{assets.root.name}.tmp-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            _build(spec, staging)
            shutil.rmtree(assets.root, ignore_errors=True)
            os.replace(staging, assets.root)
    return assets


def _build(spec: AssetSpec, root: Path) -> None:
    start = time.perf_counter()
    prompt_args = DataArguments(**asdict(spec.prompt))
    rows_by_split, train_problems = {}, None
    (root / "data").mkdir(parents=True)
    for split in spec.splits:
        problems = _problems(split.role, TRAIN_ROWS if split.role == "train" else EVAL_ROWS, spec.seed)
        if split.role == "train":
            train_problems = problems
        rows = [schema_row(split, i, p) for i, p in enumerate(problems)]
        rows_by_split[split] = rows
        with open(root / "data" / file_name(split), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    train_problems = train_problems or _problems("train", TRAIN_ROWS, spec.seed)

    examples = [
        (format_prompt(q, prompt_args), demo_completion(spec.answer_style, a, op, b, r))
        for q, a, op, b, r in train_problems
    ]
    model, tokenizer = _tiny_model(spec, examples, rows_by_split)
    warm_start(model, tokenizer, WARM_START_STEPS, lr=WARM_START_LR, seed=spec.seed, examples=examples)
    save_model(model, root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "spec.json").write_text(json.dumps({"version": ASSETS_VERSION, **asdict(spec)}, indent=2))
    (root / "COMPLETE").write_text("")
    params = sum(p.numel() for p in model.parameters())
    message = "miniature: built a %s model (%d parameters) and %d data file(s) in %.1f s under %s"
    logger.info(message, spec.family, params, len(spec.splits), time.perf_counter() - start, root)


def save_model(model, folder: Path) -> None:
    """The model as ``from_pretrained`` reads it (config, generation config, safetensors weights), written by this
    process whatever its rank. ``save_pretrained`` writes nothing on a process other than global rank 0 once a
    process group has started, and each machine builds its own cache: node 1's would get no model."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.dtype = str(model.dtype).split(".")[1]  # what save_pretrained records before writing the config:
    model.config.architectures = [type(model).__name__]  # TRL's create_model_from_path reads the class from here
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _tiny_model(spec: AssetSpec, examples: list, rows_by_split: dict):
    texts = ["user\n", "assistant\n", "system\n"] * 50
    for prompt, completion in examples:
        texts += [prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt), completion]
    for rows in rows_by_split.values():
        texts += [str(v) for row in rows for v in row.values()]
    tokenizer = build_tokenizer(vocab_size=600, seed=spec.seed, texts=texts)
    config = AutoConfig.for_model(
        spec.family,
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_SIZES,
    )
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
