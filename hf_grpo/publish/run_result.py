"""One run's result in memory: recipe values and defaults, history, evaluations, paired gain, versions, samples.

``hf_grpo.run.pipeline`` builds it after training (``RunResult.from_training``, from what the process holds) and hands
the same object to the report, the trackers and the model card. ``RunResult.load(output_dir)`` is the one reader of
a finished run's files, for the commands that write those outputs again (``python -m hf_grpo.report``,
``python -m hf_grpo.publish.hub``); ``recipe.yaml`` is read with the recipe's own YAML 1.2 loader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..base.run_files import (
    EVAL_FILE,
    EVAL_RECORDS,
    HISTORY_FILE,
    RECIPE_FILE,
    VERSIONS_FILE,
    RunFileError,
    read_checked,
)
from ..evaluation.stats import resolve_gain, usable_gain
from ..recipe import field_index, load_yaml


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors")
MODEL_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "hf_grpo")
SAMPLES_RIGHT, SAMPLES_WRONG = 3, 2  # sample completions the card shows: correct ones, then others


@dataclass
class Samples:
    """A few held-out records of one ``eval_<label>.jsonl`` (``pick_samples``), with the grades before training."""

    file: str  # eval_after.jsonl, else the newest eval_*.jsonl
    total: int  # records in that file
    records: list[dict]
    before: dict[int, str] = field(default_factory=dict)  # index -> grade in eval_before.jsonl (another file only)


@dataclass
class RunResult:
    """What the report, the trackers and the model card are written from."""

    output_dir: Path
    values: dict[str, Any] = field(default_factory=dict)  # the recipe's explicit values (recipe.yaml)
    recipe_text: str | None = None  # recipe.yaml as written, its header comment included
    defaults: dict[str, Any] = field(default_factory=dict)  # every recipe key's default
    history: list[dict] = field(default_factory=list)  # training_history.json
    evaluations: dict | None = None  # eval_results.json: before, after, gain, settings
    gain: dict | None = None  # the paired before/after gain the report shows (checked against before/after)
    versions: dict[str, str] = field(default_factory=dict)
    versions_recorded: bool = False  # versions.json of the training run, else this environment's
    adapter_config: dict | None = None  # PEFT's adapter_config.json
    samples: Samples | None = None

    @property
    def has_eval(self) -> bool:
        """Whether the run was evaluated before and after training."""
        return isinstance(self.evaluations, dict) and "before" in self.evaluations and "after" in self.evaluations

    @property
    def settings(self) -> dict:
        """How the held-out numbers were measured (``eval_results.json``'s ``settings``; empty for older runs)."""
        return (self.evaluations or {}).get("settings") or {}

    def value(self, key: str, fallback: Any = None) -> Any:
        """The recipe's value of ``key``, else its default, else ``fallback``."""
        return self.values.get(key, self.defaults.get(key, fallback))

    @classmethod
    def from_training(
        cls, output_dir, *, values: dict, recipe_text: str | None, history: list[dict], evaluations: dict | None
    ) -> RunResult:
        """The result of the run this process has just trained, from what it holds in memory; only the files others
        wrote are read (PEFT's ``adapter_config.json``, the evaluator's per-problem ``eval_*.jsonl``)."""
        out = Path(output_dir)
        evaluations = evaluations or None
        result = cls(out, dict(values), recipe_text, recipe_defaults(), list(history), evaluations)
        if result.has_eval:
            result.gain = usable_gain(evaluations.get("gain"), evaluations)
        result.versions, result.versions_recorded = library_versions(), True  # what save_recipe recorded
        result.adapter_config = _read_json(out / ADAPTER_CONFIG)
        result.samples = read_samples(out)
        return result

    @classmethod
    def load(cls, output_dir: str | Path) -> RunResult:
        """The result of the finished run in ``output_dir``, from its files (each optional); ``RunFileError`` for one
        that does not parse."""
        out = Path(output_dir)
        recipe_text, values = _read_recipe(out)
        evaluations = _read_json(out / EVAL_FILE)
        result = cls(out, values, recipe_text, recipe_defaults(), _read_json(out / HISTORY_FILE) or [])
        result.evaluations = evaluations if isinstance(evaluations, dict) else None
        if result.has_eval:
            result.gain = resolve_gain(out, result.evaluations)
        recorded = _read_json(out / VERSIONS_FILE)
        if isinstance(recorded, dict) and recorded:
            result.versions, result.versions_recorded = {str(k): str(v) for k, v in recorded.items()}, True
        else:
            result.versions = library_versions()
        result.adapter_config = _read_json(out / ADAPTER_CONFIG)
        result.samples = read_samples(out)
        return result


def as_run_result(run: RunResult | str | Path) -> RunResult:
    """``run`` itself, or the result of the finished run in that folder (``RunResult.load``)."""
    return run if isinstance(run, RunResult) else RunResult.load(run)


def run_kind(output_dir: str | Path) -> str:
    """``"adapter"``, ``"model"`` (full weights in safetensors) or ``""`` (nothing pushable)."""
    out = Path(output_dir)
    if all((out / name).is_file() for name in ADAPTER_FILES):
        return "adapter"
    has_weights = (out / "model.safetensors").is_file() or any(MODEL_SHARD.match(p.name) for p in out.iterdir())
    if (out / "config.json").is_file() and has_weights:
        return "model"
    return ""


def library_versions() -> dict[str, str]:
    """The versions of Python and the libraries a run depends on, in this environment."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def recipe_defaults() -> dict[str, Any]:
    """The default value of every recipe key."""
    defaults = {}
    for name, (_, f, _) in field_index().items():
        if f.default is not dataclasses.MISSING:
            defaults[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[name] = f.default_factory()
    return defaults


def pick_samples(records: list[dict], before: dict[int, str] | None = None) -> list[dict]:
    """Up to ``SAMPLES_RIGHT`` correct and ``SAMPLES_WRONG`` other records (topped up from the other group when one is
    short), correct ones that were wrong before training first, each group in held-out order."""
    before = before or {}
    right = [r for r in records if r.get("grade") == "correct"]
    right.sort(key=lambda r: before.get(r.get("index"), "correct") == "correct")  # stable: fixed first
    wrong = [r for r in records if r.get("grade") != "correct"]
    n_right = min(len(right), SAMPLES_RIGHT + max(0, SAMPLES_WRONG - len(wrong)))
    n_wrong = min(len(wrong), SAMPLES_WRONG + SAMPLES_RIGHT - n_right)
    return right[:n_right] + wrong[:n_wrong]


def read_samples(output_dir: Path) -> Samples | None:
    """The sample completions of the run: picked from ``eval_after.jsonl``, else from the newest ``eval_*.jsonl``."""
    path = output_dir / EVAL_RECORDS.format(label="after")
    if not path.is_file():
        found = sorted(output_dir.glob(EVAL_RECORDS.format(label="*")), key=lambda p: (p.stat().st_mtime, p.name))
        path = found[-1] if found else None
    records = _read_records(path) if path else []
    if not records:
        return None
    before_path = output_dir / EVAL_RECORDS.format(label="before")
    before = {}
    if path.name != before_path.name and before_path.is_file():
        before = {r.get("index"): r.get("grade") for r in _read_records(before_path)}
    picked = pick_samples(records, before)
    shown = {r.get("index") for r in picked}
    return Samples(path.name, len(records), picked, {i: g for i, g in before.items() if i in shown})


def _read_records(path: Path) -> list[dict]:
    records = []
    with open(path) as f:
        for line in f:
            if line.strip():
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        records.append(record)
    return records


def _read_json(path: Path) -> Any:
    """The JSON file ``path`` (None when missing); ``RunFileError`` when it is damaged."""
    return read_checked(path, object, missing_ok=True)


def _read_recipe(output_dir: Path) -> tuple[str | None, dict]:
    """(text, values) of ``recipe.yaml``; (None, {}) when the run has none."""
    path = output_dir / RECIPE_FILE
    if not path.is_file():
        return None, {}
    text = path.read_text()
    try:
        values = load_yaml(text)
    except yaml.YAMLError as exc:
        raise RunFileError(f"{path} is not valid YAML ({exc}); fix or remove it") from None
    return text, values if isinstance(values, dict) else {}
