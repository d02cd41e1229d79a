"""The model card of a run: the ``README.md`` text and its Hub metadata, written from the files in ``output_dir``.

``model_card`` returns the card; ``hf_grpo.hub.push`` uploads it as the repository's ``README.md``, and
``write_local_card`` (called by ``hf_grpo.train`` at the end of every training run) writes the same card over the blank
``README.md`` PEFT leaves in the output directory, before any push (the model is then named by the recipe's
``hub_model_id`` or the folder's name).

The metadata is built with ``huggingface_hub.ModelCardData`` (``card_data``): library, base model (a Hub id only),
pipeline, tags, datasets (Hub ids only), license (``resolve_license``) and ``model-index`` with the held-out accuracy
after and before training (``eval_results``, as ``EvalResult``), which is what the Hub parses to show evaluation
results. The text: what was trained and how, how the held-out set was evaluated (``eval_results.json``'s
``settings``), the before/after table with the paired difference and its 95% interval, a few sample completions
(``eval_after.jsonl``, ``pick_samples``), the plot, how to load it, the license, citations (TRL, GRPO, and DAPO when
the recipe uses dynamic sampling or its loss), the library versions (``versions.json``, else ``library_versions``)
and the recipe.

No path of the training machine appears in the card: names are built from public values (a local base model or
dataset file is shown by its file name), the recipe is quoted through ``public_recipe`` (a value that is a local path
becomes its file name, the ``# resolved from ...`` header too), and ``scrub_paths`` runs over the whole card last. The
same helpers (``is_local_path``, ``scrub_paths``, ``public_value``, ``public_recipe``) clean the other uploaded files
in ``hf_grpo.hub`` (``public_files``).

A run file that does not parse (``recipe.yaml``, a JSON report) raises ``HubUsageError``, the error of everything
the user can fix before a push; ``write_local_card`` turns it into a warning.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import platform
import re
from pathlib import Path
from typing import Any

from .outputs import EVAL_FILE, EVAL_RECORDS, HISTORY_FILE, PLOT_FILE, RECIPE_FILE, VERSIONS_FILE


logger = logging.getLogger("hf_grpo.card")

CARD_FILE = "README.md"

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "hf_grpo")
TAGS = ["trl", "grpo", "hf_grpo", "math"]
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubUsageError(ValueError):
    """Something the user can fix (a run file that does not parse; when pushing, ``hf_grpo.hub``: missing files, no
    token, a token inside a file); the CLI exits with 2."""


# ---------------------------------------------------------------------------------------------------------------------
# Reading a run


def read_json(path: Path) -> Any:
    """The JSON file ``path`` (None when missing); ``HubUsageError`` when it does not parse."""
    if not path.is_file():
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HubUsageError(f"{path} is not valid JSON ({exc}); fix or remove it before pushing") from None


def read_recipe(output_dir: str | Path) -> tuple[str | None, dict]:
    """(text, values) of ``recipe.yaml``; (None, {}) when the run has none."""
    import yaml

    path = Path(output_dir) / RECIPE_FILE
    if not path.is_file():
        return None, {}
    text = path.read_text()
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HubUsageError(f"{path} is not valid YAML ({exc}); fix or remove it before pushing") from None
    return text, values if isinstance(values, dict) else {}


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


def _recorded_versions(output_dir: Path) -> tuple[dict[str, str], bool]:
    """(versions, recorded at training time?): ``versions.json`` when the run wrote one, else this environment's."""
    recorded = read_json(output_dir / VERSIONS_FILE)
    if isinstance(recorded, dict) and recorded:
        return {str(k): str(v) for k, v in recorded.items()}, True
    return library_versions(), False


def _hub_model_id(name: Any) -> str | None:
    """``name`` when it looks like a Hub model id (``owner/name``) and is not a local path, else None."""
    if not isinstance(name, str) or not HUB_REPO_ID.match(name) or name.startswith((".", "~")):
        return None
    return None if Path(name).expanduser().exists() else name


def _hub_dataset_id(name: Any) -> str | None:
    if not isinstance(name, str) or name == "arithmetic":
        return None
    with contextlib.suppress(Exception):  # the alias table lives with the loaders
        from .data.loaders import ALIASES

        name = ALIASES.get(name, name)
    return name if HUB_REPO_ID.match(name) and not Path(name).expanduser().exists() else None


def _defaults() -> dict[str, Any]:
    """Default value of every recipe key (empty when the config classes cannot be imported)."""
    import dataclasses

    try:
        from .recipe import field_index
    except Exception:  # noqa: BLE001 - the card still renders without defaults
        return {}
    defaults = {}
    for name, (_, f, _) in field_index().items():
        if f.default is not dataclasses.MISSING:
            defaults[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[name] = f.default_factory()
    return defaults


# ---------------------------------------------------------------------------------------------------------------------
# Local paths: nothing that names a folder of the training machine goes up


# An absolute path with at least two components (/tmp/run, /home/me/data.jsonl, C:/Users/me/x) or under ~, not inside a
# word, a URL (https://host/a/b) or a longer path. One component (/s, /data) is left alone: too many false positives.
ABS_PATH = re.compile(
    r"(?<![\w.:/~\\-])(?:"
    r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}/?"
    r"|~(?:/[\w.@+-]+)+/?"
    r"|[A-Za-z]:\\(?:[\w.@+-]+\\)*[\w.@+-]+"
    r")"
)
LOCAL_PREFIXES = ("/", "~", "./", "../", ".\\", "..\\")
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")  # a dataset read from a file (hf_grpo.data.loaders)
RECIPE_HEADER = re.compile(r"^(# resolved from )(.+?)( and the command line)", re.MULTILINE)
RECIPE_LINE = re.compile(r"^(\s*(?:- +)?(?:[\w.-]+: +)?)(.*)$", re.DOTALL)  # (indent, item dash, key) and the rest


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path.rstrip("/\\"))[-1] or "<local>"


def is_local_path(value: str) -> bool:
    """Whether ``value`` is a path into this machine: absolute, under ``~`` or relative to ``.``/``..``.

    A plain relative name (``outputs/tiny``, ``Qwen/Qwen2.5-Math-1.5B``) says nothing about the machine and is kept.
    """
    return value.startswith(LOCAL_PREFIXES) or bool(re.match(r"^[A-Za-z]:[\\/]", value))


def scrub_paths(text: str) -> str:
    """``text`` with every absolute path (two components or more, or under ``~``) replaced by its last component."""
    return ABS_PATH.sub(lambda m: _basename(m.group(0)), text)


def public_value(value: Any, *, nested: bool = True) -> Any:
    """``value`` (a recipe or JSON value) with local paths replaced: a string that is one by its file name, paths
    inside other strings by theirs; lists and dicts element by element (only when ``nested``)."""
    if isinstance(value, str):
        if is_local_path(value) and not any(c.isspace() for c in value):
            return _basename(value)
        return scrub_paths(value)
    if nested and isinstance(value, list):
        return [public_value(v) for v in value]
    if nested and isinstance(value, dict):
        return {k: public_value(v) for k, v in value.items()}
    return value


def public_recipe(text: str) -> str:
    """``recipe.yaml`` as it is uploaded and quoted in the card, line by line so that comments stay: a value that is a
    local path becomes its file name (``output_dir: /tmp/run`` -> ``output_dir: run``, list items alike), the header
    ``save_recipe`` writes names the recipe by its file name when it was given as a local path (``# resolved from
    /home/me/r.yaml ...`` -> ``# resolved from r.yaml ...``), and ``scrub_paths`` cleans what is left (comments, paths
    inside longer strings or flow-style lists)."""
    text = RECIPE_HEADER.sub(lambda m: m.group(1) + _header_path(m.group(2)) + m.group(3), text)
    return "".join(_public_recipe_line(line) for line in text.splitlines(keepends=True))


def _public_recipe_line(line: str) -> str:
    import yaml

    prefix, rest = RECIPE_LINE.match(line).groups()
    if rest.strip() and not rest.lstrip().startswith("#"):
        try:
            value = yaml.safe_load(rest)
        except yaml.YAMLError:  # part of a multi-line value: left to scrub_paths
            value = None
        if isinstance(value, str) and is_local_path(value) and not any(c.isspace() for c in value):
            public = yaml.safe_dump(_basename(value)).splitlines()[0]  # quoted where YAML needs it ('123', 'yes')
            raw = next((r for r in (f"'{value}'", f'"{value}"', value) if r in rest), None)
            rest = rest.replace(raw, public, 1) if raw else rest
    return scrub_paths(prefix + rest)


def _header_path(path: str) -> str:
    return _basename(path) if is_local_path(path) else path


# ---------------------------------------------------------------------------------------------------------------------
# Model card


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _setting(values: dict, defaults: dict, key: str) -> str | None:
    if key in values:
        return f"`{_fmt(values[key])}`"
    if key in defaults:
        return f"`{_fmt(defaults[key])}` (default)"
    return None


def _base_description(values: dict, adapter_config: dict | None) -> tuple[str, str, str | None]:
    """(short name, Markdown description, Hub id or None) of the base model."""
    name = values.get("model_name_or_path")
    if name == "tiny":
        size = values.get("tiny_hidden_size", 128)
        warm = values.get("warm_start_steps", 300)
        long = (
            f"the embedded tiny Qwen2-architecture model of hf_grpo (2 layers, hidden size {size}), built from "
            f"scratch on the training machine and warm-started with {warm} supervised steps; not on the Hub"
        )
        return "the embedded tiny model of hf_grpo", long, None
    hub_id = _hub_model_id((adapter_config or {}).get("base_model_name_or_path")) or _hub_model_id(name)
    if hub_id:
        revision = values.get("model_revision")
        suffix = f" (revision `{revision}`)" if revision and revision != "main" else ""
        link = f"[{hub_id}](https://huggingface.co/{hub_id}){suffix}"
        return link, link, hub_id
    local = "a local model" + (f" (`{Path(str(name)).name}`)" if name else "")
    return local, local, None


def _dataset_task(values: dict, defaults: dict) -> tuple[str, str | None, str | None]:
    """(dataset name as given, its Hub id or None, grading task ``gsm8k``/``math`` or None)."""
    name = values.get("dataset_name", defaults.get("dataset_name", "arithmetic"))
    task = values.get("task")
    with contextlib.suppress(Exception):  # the presets live with the loaders
        from .data.loaders import ALIASES, PRESETS

        task = task or PRESETS.get(ALIASES.get(name, name), {}).get("task")
    return name, _hub_dataset_id(name), task


def _data_description(values: dict, defaults: dict) -> str:
    name, hub_id, _ = _dataset_task(values, defaults)
    if name == "arithmetic":
        train = values.get("arithmetic_train_size", defaults.get("arithmetic_train_size"))
        held = values.get("arithmetic_eval_size", defaults.get("arithmetic_eval_size"))
        sizes = f"; {train} problems for training, {held} held out" if train and held else ""
        return (
            "arithmetic word problems generated by hf_grpo (`hf_grpo.data.arithmetic`): GSM8K-style, the answer "
            f"after `####`{sizes}"
        )
    if hub_id:
        config = values.get("dataset_config")
        return f"[{hub_id}](https://huggingface.co/datasets/{hub_id})" + (f" (config `{config}`)" if config else "")
    return f"a local file (`{Path(str(name)).name}`)"


GRADING = {
    "gsm8k": "the number after its `####` equals the gold answer",
    "math": "its last `\\boxed{}` is equivalent to the gold answer (checked with math-verify)",
}


def _history_facts(history: list[dict]) -> str | None:
    if not history:
        return None
    facts = [f"{history[-1].get('step', '?')} optimizer steps"]
    runtime = next((r["train_runtime"] for r in reversed(history) if "train_runtime" in r), None)
    if runtime is not None:
        facts.append(f"{runtime:.0f} s of training")
    logged = [r for r in history if r.get("reward") is not None]
    if logged:
        facts.append(
            f"mean reward {logged[0]['reward']:.3f} at the first log and {logged[-1]['reward']:.3f} at the last"
        )
    return "This run: " + ", ".join(facts) + "."


SETTINGS = [
    ("learning rate", "learning_rate"),
    ("schedule", "lr_scheduler_type"),
    ("optimizer steps (max_steps)", "max_steps"),
    ("completions per prompt (num_generations)", "num_generations"),
    ("per-device batch (completions)", "per_device_train_batch_size"),
    ("gradient accumulation", "gradient_accumulation_steps"),
    ("max completion length", "max_completion_length"),
    ("sampling temperature", "temperature"),
    ("KL coefficient (beta)", "beta"),
    ("loss", "loss_type"),
    ("reward scaling", "scale_rewards"),
    ("clipping epsilon", "epsilon"),
    ("dynamic sampling", "dynamic_sampling"),
    ("advantage estimator", "advantage_estimator"),
    ("seed", "seed"),
]


def _eval_dataset(settings: dict, values: dict, defaults: dict) -> dict[str, str | None]:
    """The held-out set as ``EvalResult`` describes it: ``type`` (Hub id, preset or file name), ``name``, ``config``,
    ``split``. From ``eval_results.json``'s ``settings`` (written by ``hf_grpo.train``); a run from before they were
    recorded falls back to the recipe (split ``test`` for the embedded arithmetic set, else ``dataset_test_split``)."""
    if settings:
        name, config, split = settings.get("dataset"), settings.get("dataset_config"), settings.get("split")
    else:
        name = values.get("eval_dataset_name") or values.get(
            "dataset_name", defaults.get("dataset_name", "arithmetic")
        )
        config = values.get("dataset_config")
        split = (
            "test" if name == "arithmetic" else values.get("dataset_test_split", defaults.get("dataset_test_split"))
        )
    name = _public_name(str(name or "unknown"))
    hub_id = _hub_dataset_id(name)
    if hub_id:
        pretty = hub_id
    elif name == "arithmetic":
        pretty = "hf_grpo arithmetic word problems"
    else:
        pretty = f"{name} (local file)"
    return {"type": hub_id or name, "name": pretty, "config": config, "split": split}


def _public_name(name: str) -> str:
    """A dataset or model name as the card may show it: a local path becomes its file name."""
    return _basename(name) if is_local_path(name) or Path(name).suffix.lower() in DATA_FILE_SUFFIXES else name


def eval_results(results: dict, settings: dict, values: dict, defaults: dict) -> list:
    """``EvalResult``s for the card's ``model-index``: held-out accuracy after training (``accuracy``) and before it
    (``accuracy (before training)``), both on the same task and dataset, so the Hub lists them side by side."""
    from huggingface_hub import EvalResult

    dataset = _eval_dataset(settings, values, defaults)
    common = {
        "task_type": "text-generation",
        "task_name": "Math word problems (final answer)",
        "dataset_type": dataset["type"],
        "dataset_name": dataset["name"],
        "dataset_config": dataset["config"],
        "dataset_split": dataset["split"],
        "metric_type": "accuracy",
    }
    return [
        EvalResult(**common, metric_value=round(results["after"]["accuracy"], 4), metric_name="accuracy"),
        EvalResult(
            **common, metric_value=round(results["before"]["accuracy"], 4), metric_name="accuracy (before training)"
        ),
    ]


def resolve_license(values: dict, license: str | None = None) -> str | None:
    """The ``license`` of the card's metadata.

    ``license`` when the caller gives one (``python -m hf_grpo.hub ... --license ID``). Otherwise ``apache-2.0`` for
    the embedded tiny model only: hf_grpo (Apache-2.0) builds its weights from scratch and generates its data, so
    nothing else's terms apply. For any other base model the adapter or fine-tune falls under the base model's
    license, which cannot be known offline (it lives in the base model's card on the Hub); the key is then left out
    rather than guessed (``other`` would claim a custom license), and the card's License section says so.
    """
    if license:
        return license
    return "apache-2.0" if values.get("model_name_or_path") == "tiny" else None


def card_data(
    *,
    kind: str,
    merged: bool,
    base_id: str | None,
    dataset_id: str | None,
    license: str | None,
    model_name: str,
    results: list,
):
    """The card's metadata as ``huggingface_hub.ModelCardData``: library, base model (a Hub id only), pipeline,
    tags, datasets (Hub ids only), license, and the held-out results as ``model-index``."""
    from huggingface_hub import ModelCardData

    extra = {"base_model_relation": "merge"} if base_id and merged else {}
    return ModelCardData(
        library_name="peft" if kind == "adapter" else "transformers",
        base_model=base_id,
        license=license,
        pipeline_tag="text-generation",
        tags=list(TAGS),
        datasets=[dataset_id] if dataset_id else None,
        metrics=["accuracy"] if results else None,
        model_name=model_name if results else None,  # without results it would be dumped as a key of its own
        eval_results=results or None,
        **extra,
    )


# Written from the facts of each work (title, first author, year, where it is published); "and others" is et al.
CITATIONS = {
    "trl": """@misc{vonwerra2020trl,
  title        = {{TRL: Transformer Reinforcement Learning}},
  author       = {von Werra, Leandro and others},
  year         = {2020},
  publisher    = {GitHub},
  journal      = {GitHub repository},
  howpublished = {\\url{https://github.com/huggingface/trl}}
}""",
    "grpo": """@article{shao2024deepseekmath,
  title         = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
  author        = {Shao, Zhihong and others},
  year          = {2024},
  eprint        = {2402.03300},
  archivePrefix = {arXiv},
  primaryClass  = {cs.CL},
  url           = {https://arxiv.org/abs/2402.03300}
}""",
    "dapo": """@article{yu2025dapo,
  title         = {{DAPO: An Open-Source LLM Reinforcement Learning System at Scale}},
  author        = {Yu, Qiying and others},
  year          = {2025},
  eprint        = {2503.14476},
  archivePrefix = {arXiv},
  primaryClass  = {cs.LG},
  url           = {https://arxiv.org/abs/2503.14476}
}""",
}


def _uses_dapo(values: dict, defaults: dict) -> bool:
    return bool(values.get("dynamic_sampling", defaults.get("dynamic_sampling"))) or (
        values.get("loss_type", defaults.get("loss_type")) == "dapo"
    )


def _citation_section(values: dict, defaults: dict) -> list[str]:
    keys = ["trl", "grpo"] + (["dapo"] if _uses_dapo(values, defaults) else [])
    why = (
        "This model was trained with [TRL](https://github.com/huggingface/trl)'s `GRPOTrainer` (through hf_grpo), "
        "with GRPO as introduced in DeepSeekMath ([arXiv:2402.03300](https://arxiv.org/abs/2402.03300))"
    )
    if "dapo" in keys:
        why += (
            " and DAPO's dynamic sampling and/or token-level loss ([arXiv:2503.14476](https://arxiv.org/abs/2503.14476)"
            "), as its recipe turns on"
        )
    lines = ["## Citations", "", why + ". Cite them as:", ""]
    for key in keys:
        lines += ["```bibtex", CITATIONS[key], "```", ""]
    return lines


def _license_section(license: str | None, given: bool, base_short: str, base_id: str | None) -> list[str]:
    lines = ["## License", ""]
    if given:
        lines.append(f"`{license}`, as given when this model was pushed.")
    elif license:
        lines.append(
            f"`{license}`, the license of hf_grpo: the embedded tiny model is built from scratch by hf_grpo's code "
            "and trained on problems it generates, so no third-party weights or data are involved."
        )
    else:
        where = f" (see [its model card](https://huggingface.co/{base_id}))" if base_id else ""
        lines.append(
            f"Not set. This model derives from {base_short}, whose license applies to it as well{where}; hf_grpo "
            "cannot read that license offline. Push with `python -m hf_grpo.hub ... --license ID` (e.g. "
            "`apache-2.0`) to record it in this card's metadata. The training data has a license of its own."
        )
    return lines + [""]


# ---- sample completions

SAMPLES_RIGHT, SAMPLES_WRONG = 3, 2
SAMPLE_CHARS = 1200  # longer prompts, completions and references are cut, with a marker


def sample_records_file(output_dir: Path) -> Path | None:
    """``eval_after.jsonl``, else the newest ``eval_*.jsonl`` of the run, else None."""
    after = output_dir / EVAL_RECORDS.format(label="after")
    if after.is_file():
        return after
    found = sorted(output_dir.glob(EVAL_RECORDS.format(label="*")), key=lambda p: (p.stat().st_mtime, p.name))
    return found[-1] if found else None


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


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        messages = [m for m in prompt if isinstance(m, dict)]
        if len(messages) == 1:
            return str(messages[0].get("content", ""))
        return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in messages)
    return str(prompt)


def _block(text: str) -> list[str]:
    text = text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + " [...]"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]


def _samples_section(output_dir: Path) -> list[str]:
    path = sample_records_file(output_dir)
    records = _read_records(path) if path else []
    if not records:
        return []
    before_path = output_dir / EVAL_RECORDS.format(label="before")
    before = {}
    if path.name != before_path.name and before_path.is_file():
        before = {r.get("index"): r.get("grade") for r in _read_records(before_path)}
    picked = pick_samples(records, before)
    label = path.stem.removeprefix("eval_")
    lines = [
        "## Sample completions",
        "",
        (
            f"{len(picked)} of the {len(records)} held-out problems with this model's greedy completion "
            f"(from `{path.name}`, evaluation *{label}*, which is uploaded with every other `eval_*.jsonl`: one "
            "record per problem with its prompt, reference, completion and grade)."
        ),
        "",
    ]
    for n, record in enumerate(picked, 1):
        grade = record.get("grade", "?")
        was = before.get(record.get("index"))
        change = f"; {was} before training" if was and was != grade else ""
        lines += [f"**{n}. {grade}** (held-out problem {record.get('index', '?')}{change})", "", "Prompt:", ""]
        lines += _block(_prompt_text(record.get("prompt", "")))
        lines += ["", "Completion:", ""]
        lines += _block(str(record.get("completion", "")))
        lines += ["", "Reference:", ""]
        lines += _block(str(record.get("gold", "")))
        lines.append("")
    return lines


def _local_ref(output_dir: Path, values: dict) -> str:
    """What the card of a run not pushed yet calls the model: the recipe's ``hub_model_id``, else the folder's name."""
    hub_id = values.get("hub_model_id")
    return hub_id if isinstance(hub_id, str) and HUB_REPO_ID.match(hub_id) else output_dir.resolve().name


def model_card(
    output_dir: str | Path, repo_id: str | None = None, *, merged: bool = False, license: str | None = None
) -> str:
    """The README.md for ``repo_id``: Hub metadata (``huggingface_hub.ModelCardData`` with the held-out results as
    ``model-index``), how the model was trained and evaluated, sample completions, license, citations, versions and
    the recipe.

    Without ``repo_id`` it is the card of the run before any push (``write_local_card``): the model is named by the
    recipe's ``hub_model_id`` or the output folder's name, and the usage section says so. No local path survives:
    ``scrub_paths`` runs over the whole card last, after every piece has already been built from public values.
    """
    out = Path(output_dir)
    kind = "model" if merged else run_kind(out) or "adapter"
    recipe_text, values = read_recipe(out)
    defaults = _defaults()
    adapter_config = read_json(out / "adapter_config.json")
    results = read_json(out / EVAL_FILE)
    history = read_json(out / HISTORY_FILE) or []
    has_eval = isinstance(results, dict) and "before" in results and "after" in results
    settings = (results.get("settings") if isinstance(results, dict) else None) or {}
    gain = None
    if has_eval:
        from .evaluation.report import read_gain

        gain = read_gain(out, results)
    versions, recorded = _recorded_versions(out)
    base_short, base_text, base_id = _base_description(values, adapter_config)
    _, dataset_id, task = _dataset_task(values, defaults)
    task = settings.get("task") or task
    ref = repo_id or _local_ref(out, values)
    title = ref.split("/")[-1]
    card_license = resolve_license(values, license)

    data = card_data(
        kind=kind,
        merged=merged,
        base_id=base_id,
        dataset_id=dataset_id,
        license=card_license,
        model_name=title,
        results=eval_results(results, settings, values, defaults) if has_eval else [],
    )

    if merged:
        what = f"This is {base_short} with a LoRA adapter merged into its weights."
    elif kind == "adapter":
        what = f"This is a LoRA adapter for {base_short}."
    else:
        what = f"This is {base_short}, fine-tuned in full."
    lines = [f"# {title}", ""]
    lines.append(
        f"{what} It was trained with GRPO (Group Relative Policy Optimization: several "
        "completions are sampled per problem and each one is pushed up or down by how its reward compares with the "
        "rest of its group) to solve math word problems, with hf_grpo, a recipe-driven trainer built on "
        "[TRL](https://github.com/huggingface/trl)'s `GRPOTrainer`."
    )
    if has_eval:
        from .evaluation.report import gain_interval

        paired = f", a paired difference of {gain_interval(gain)}" if gain is not None else ""
        lines.append("")
        lines.append(
            f"On {results['after']['total']} held-out problems, greedy-decoded, accuracy went from "
            f"{results['before']['accuracy']:.1%} before training to {results['after']['accuracy']:.1%} after{paired}."
        )
    lines.append("")
    lines += _training_section(out, values, defaults, kind, merged, adapter_config, base_text, history)
    lines += _results_section(results if has_eval else None, gain, settings, values, defaults, task)
    lines += _samples_section(out)
    lines += _plot_section(out, gain)
    lines += _usage_section(kind, ref, base_id, local=repo_id is None, folder=out.resolve().name)
    lines += _license_section(card_license, bool(license), base_short, base_id)
    lines += _citation_section(values, defaults)
    lines += _versions_section(versions, recorded)
    lines += _recipe_section(recipe_text)
    return scrub_paths(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def _training_section(out, values, defaults, kind, merged, adapter_config, base_text, history) -> list[str]:
    lines = ["## Training", ""]
    lines.append(f"- **Base model**: {base_text}")
    lines.append(f"- **Data**: {_data_description(values, defaults)}")
    rewards = values.get("reward_funcs", defaults.get("reward_funcs")) or []
    reward_text = ", ".join(f"`{public_value(r)}`" for r in rewards) or "none recorded"
    weights = values.get("reward_weights")
    if weights:
        reward_text += f" with weights {_fmt(weights)}"
    lines.append(f"- **Rewards**: {reward_text}")
    if kind == "adapter" or merged:
        cfg = adapter_config or {}
        targets = cfg.get("target_modules") or values.get("lora_target_modules")
        lines.append(
            f"- **LoRA**: rank {cfg.get('r', values.get('lora_r'))}, alpha {cfg.get('lora_alpha', values.get('lora_alpha'))}, "
            f"dropout {_fmt(cfg.get('lora_dropout', values.get('lora_dropout')))}, on "
            f"{_fmt(sorted(targets) if isinstance(targets, list) else targets)}"
        )
    rows = [(label, _setting(values, defaults, key)) for label, key in SETTINGS]
    rows = [(label, text) for label, text in rows if text is not None]
    if rows:
        lines += ["", "Key GRPO settings (the full recipe is below):", "", "| setting | value |", "|---|---|"]
        lines += [f"| {label} | {text} |" for label, text in rows]
    facts = _history_facts(history)
    if facts:
        lines += ["", facts]
    return lines + [""]


def _eval_setup(results: dict, settings: dict, values: dict, defaults: dict) -> str:
    """One sentence: how the held-out numbers were measured."""
    total = results["after"]["total"]
    if not settings:
        return f"Greedy decoding on {total} held-out problems (the run's evaluation split)."
    dataset = _eval_dataset(settings, values, defaults)
    where = dataset["name"] + (f", config `{dataset['config']}`" if dataset["config"] else "")
    where += f", split `{dataset['split']}`" if dataset["split"] else ""
    budget = f" (at most {settings['max_new_tokens']} new tokens)" if settings.get("max_new_tokens") else ""
    style = f"; prompts in the `{settings['prompt_style']}` style" if settings.get("prompt_style") else ""
    decoding = str(settings.get("decoding", "greedy")).capitalize()
    return f"{decoding} decoding{budget} on {settings.get('num_problems', total)} held-out problems of {where}{style}."


def _results_section(results, gain, settings, values, defaults, task) -> list[str]:
    lines = ["## Held-out accuracy", ""]
    if results is None:
        return lines + ["This run recorded no before/after evaluation (`eval_results.json` is missing).", ""]
    from .evaluation.report import eval_table, gain_sentence

    grading = f" A completion counts as correct when {GRADING[task]}." if task in GRADING else ""
    setup = _eval_setup(results, settings, values, defaults)
    lines += [
        (
            f"{setup}{grading} *Before* is the starting policy, *after* is this model. The same numbers are in this "
            "card's metadata (`model-index`), so the Hub lists them as evaluation results."
        ),
        "",
        eval_table(results, gain),
        "",
    ]
    if gain is not None:
        lines += [gain_sentence(gain), ""]
    return lines


def _plot_section(out: Path, gain: dict | None) -> list[str]:
    if not (out / PLOT_FILE).is_file():
        return []
    return [
        "## Training curves",
        "",
        (
            "Mean reward per step, train vs held-out accuracy"
            + (" (with the before -> after difference and its 95% interval)" if gain is not None else "")
            + ", policy loss, and the per-step reward range:"
        ),
        "",
        f"![training curves]({PLOT_FILE})",
        "",
    ]


def _usage_section(kind: str, ref: str, base_id: str | None, *, local: bool, folder: str) -> list[str]:
    lines = ["## Usage", ""]
    if local:
        stands = "this folder (give its path)" if ref == folder else f"this folder (`{folder}`; give its path)"
        lines += [
            (
                f"This card was written by the training run into its output folder, before any push: `{ref}` below "
                f"stands for {stands} or for the Hub repository the run goes to with `python -m hf_grpo.hub "
                f"{folder} USER/NAME`, which writes this card again with the repository's id."
            ),
            "",
        ]
    if kind == "adapter":
        if base_id is None:
            lines += [
                (
                    "The base model is not on the Hub, so point `from_pretrained` at a local copy of it (for the "
                    "embedded tiny model: the `base_model/` folder of the training run). Or push with `--merged` to "
                    "get a standalone model."
                ),
                "",
            ]
        lines += [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{base_id or "PATH/TO/BASE_MODEL"}")',
            f'model = PeftModel.from_pretrained(base, "{ref}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{ref}")',
            "model = model.merge_and_unload()  # optional: fold the adapter into the weights for faster inference",
            "```",
        ]
    else:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{ref}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{ref}")',
            "```",
        ]
    return lines + [
        "",
        (
            "Prompts go through the tokenizer's chat template as in training, e.g. "
            '`tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)`.'
        ),
        "",
    ]


def _versions_section(versions: dict[str, str], recorded: bool) -> list[str]:
    where = "recorded when the model was trained" if recorded else "of the environment that pushed this model"
    lines = [f"## Framework versions ({where})", "", "| library | version |", "|---|---|"]
    return lines + [f"| {name} | {version} |" for name, version in versions.items()] + [""]


def _recipe_section(recipe_text: str | None) -> list[str]:
    if recipe_text is None:
        return ["## Recipe", "", "This run left no `recipe.yaml`.", ""]
    return [
        "## Recipe",
        "",
        (
            f"The resolved recipe of this run (`{RECIPE_FILE}`, also in this repository; local paths are replaced by "
            f"their file names). Train again with `python -m hf_grpo.train {RECIPE_FILE} --output_dir DIR` (any other "
            "key can be overridden the same way)."
        ),
        "",
        "```yaml",
        public_recipe(recipe_text).rstrip("\n"),
        "```",
        "",
    ]


def write_local_card(output_dir: str | Path) -> Path | None:
    """Write the model card into ``output_dir/README.md``, replacing the blank template PEFT's ``save_pretrained``
    leaves there; ``hf_grpo.train`` calls it on the main process at the end of a run. The card is the one ``push``
    uploads, with the repository id not known yet (``model_card`` without ``repo_id``). A run file it cannot read
    (broken JSON or YAML) leaves PEFT's README.md in place with a warning: the training itself has succeeded."""
    out = Path(output_dir)
    try:
        card = model_card(out)
    except HubUsageError as exc:
        logger.warning("model card not written: %s", exc)
        return None
    path = out / CARD_FILE
    path.write_text(card)
    return path
