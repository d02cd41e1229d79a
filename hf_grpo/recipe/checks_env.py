"""The checks that depend on this machine and its environment: trackers installed, what a push to the Hub needs,
datasets reachable offline, LoRA targets and sizes that fit the model's config on disk, and the hardware."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from accelerate import init_empty_weights
from datasets import config as datasets_config
from huggingface_hub import constants
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

from ..base.hub_token import env_token, hub_timeout
from ..config import ModelArguments
from ..data.lengths import context_limits, prompt_budget
from ..data.loaders import PRESETS, DataArguments, is_local_file, source_splits
from ..evaluation.checks import check_hub_id
from ..generation.settings import GenerationArguments
from ..launch.hardware import MINIATURE_HINT, hardware_problems
from ..launch.processes import Layout
from ..models import registry as local_models
from .schema import RecipeError, key_defaults


TINY_CONTEXT = 256  # max_position_embeddings of the embedded tiny model (hf_grpo.models.tiny.build_model)
LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"  # vLLM's switch for a max_model_len over the model's context
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "azure_ml": "azureml-core", "flyte": "flytekit"}


def check_report_to(values: dict) -> None:
    """Each tracker is one transformers knows, and its package is installed (both fail only once training starts)."""
    # transformers' integrations probe many optional packages: loaded when a recipe is checked, not on import
    from transformers.integrations import integration_utils as integrations

    report_to = values.get("report_to")
    trackers = [report_to] if isinstance(report_to, str) else list(report_to or [])
    known = [*integrations.INTEGRATION_TO_CALLBACK, "all", "none"]
    for tracker in trackers:
        if tracker not in known:
            close = difflib.get_close_matches(str(tracker), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RecipeError(f"report_to: unknown tracker {tracker!r}; {hint}known: {sorted(known)}")
        if tracker not in ("all", "none") and tracker not in integrations.get_available_reporting_integrations():
            package = TRACKER_PACKAGES.get(tracker, tracker.replace("_", "-"))
            raise RecipeError(
                f"report_to: {tracker!r} needs the {package} package, which is not installed; "
                f"pip install {package}, or remove {tracker} from report_to"
            )


def check_push(values: dict, env: dict[str, str]) -> None:
    """What the push after training needs, checked before it: a repo id, a token, the Hub reachable, one push."""
    if not values.get("hub_model_id"):
        raise RecipeError(
            "push_to_hub needs hub_model_id (e.g. your-name/qwen7b-grpo); the token comes "
            "from the HF_TOKEN environment variable"
        )
    if env_token() is None:
        raise RecipeError(
            "push_to_hub: true but there is no Hugging Face token in the environment, so the push after "
            "training would fail: export HF_TOKEN=hf_... (write access) before the run, or set push_to_hub: false"
        )
    try:
        hub_timeout()
    except ValueError as exc:
        raise RecipeError(f"push_to_hub: true, but {exc}") from None
    offline = [name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if _is_set(name, env)]
    if offline:
        raise RecipeError(
            f"push_to_hub: true but {offline[0]} is set, so the push after training would fail: unset it "
            "(and load the model and data from local paths), or set push_to_hub: false"
        )
    strategy = values.get("hub_strategy")
    if strategy is not None and str(strategy) not in ("end", "HubStrategy.END"):
        raise RecipeError(
            f"hub_strategy: {strategy} is not supported: hf_grpo pushes once, at the end, with the held-out "
            "results in the model card; remove hub_strategy (or set it to end)"
        )


def _is_set(name: str, env: dict[str, str]) -> bool:
    return env.get(name, os.environ.get(name, "")).strip().lower() in ("1", "true", "yes", "on")


def _dataset_cached(name: str) -> bool:
    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}"
    prepared = Path(datasets_config.HF_DATASETS_CACHE) / name.replace("/", "___")
    return hub.is_dir() or prepared.is_dir()


def check_offline(data: DataArguments, env: dict[str, str]) -> None:
    """Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), a hub dataset other than a preset must be mirrored locally or
    already cached (a preset's splits are checked when they load: ``--miniature`` mirrors them)."""
    if not (_is_set("HF_HUB_OFFLINE", env) or _is_set("HF_DATASETS_OFFLINE", env)):
        return
    mirror = data.dataset_mirror or {}
    for spec, split in source_splits(data).values():
        name = spec["name"]
        if name in PRESETS or is_local_file(name) or f"{name}:{split}" in mirror or _dataset_cached(name):
            continue
        key = "dataset_name" if name == data.resolved()["name"] else "eval_dataset_name"
        raise RecipeError(
            f"{key}: hub dataset {name!r} (split {split!r}) cannot be downloaded offline (HF_HUB_OFFLINE or "
            f"HF_DATASETS_OFFLINE is set) and is not cached; unset the variable, use a local file, or map "
            f"'{name}:{split}' to one in dataset_mirror"
        )


def local_config(model: ModelArguments, trust_remote_code: bool):
    """The policy's config from this machine's files; None when it is not there (a hub model not yet downloaded)."""
    try:
        return AutoConfig.from_pretrained(
            model.model_name_or_path,
            revision=model.model_revision,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError):  # not downloaded (or needs remote code): checked when the model loads
        return None


def _module_names(model: ModelArguments, trust_remote_code: bool) -> dict[str, bool] | None:
    """The module names of the policy (name -> whether it is a leaf), built on the meta device from its config (no
    weights); None when its config is not on this machine (a hub model not yet downloaded)."""
    if model.model_name_or_path == "tiny":
        config = Qwen2Config(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    elif (config := local_config(model, trust_remote_code)) is None:
        return None
    try:
        with init_empty_weights():
            built = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, ImportError, OSError):  # an architecture this transformers cannot build
        return None
    return {name: not any(module.children()) for name, module in built.named_modules()}


def check_lora_targets(model: ModelArguments, values: dict, built_later: set) -> None:
    """Each ``lora_target_modules`` entry matches a module of the policy (checked on a meta-device copy)."""
    targets = model.lora_target_modules
    if (
        not model.use_peft
        or targets in (None, "all-linear", ["all-linear"])
        or model.model_name_or_path in built_later
    ):
        return
    names = _module_names(model, bool(values.get("trust_remote_code")))
    if names is None:
        return
    if isinstance(targets, str):
        try:
            if any(re.fullmatch(targets, n) for n in names):
                return
        except re.error as exc:
            raise RecipeError(f"lora_target_modules: {targets!r} is not a valid regex ({exc})") from None
        targets = [targets]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, leaf in names.items() if leaf})
        close = difflib.get_close_matches(missing[0], leaves, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RecipeError(
            f"lora_target_modules: {missing} match no module of {model.model_name_or_path}; {hint}its "
            f"layers are {leaves}, or write lora_target_modules: all-linear"
        )


def _contexts(model: ModelArguments, trust_remote_code: bool) -> tuple[int, int] | None:
    """The policy's ``context_limits``; None when its config cannot be read here."""
    if model.model_name_or_path == "tiny":
        return TINY_CONTEXT, TINY_CONTEXT
    config = local_config(model, trust_remote_code)
    return context_limits(config) if config is not None else None


def check_sizes(
    model: ModelArguments, values: dict, generation: GenerationArguments, env: dict, built_later: set
) -> None:
    """Prompt + completion fit the model's context (its config, read without loading weights), as
    ``hf_grpo.data.lengths.prompt_budget`` checks again once the tokenizer loads; a miniature's model is built later
    and a config not on this machine is skipped."""
    if model.model_name_or_path in built_later:
        return
    contexts = _contexts(model, bool(values.get("trust_remote_code")))
    if contexts is None:
        return
    context, longest = contexts
    source = f"max_position_embeddings {context} in the config of {model.model_name_or_path}"
    given = {
        "generation.max_model_len": generation.max_model_len,
        "vllm_max_model_length": values.get("vllm_max_model_length"),
    }
    lengths = {key: value for key, value in given.items() if value is not None}
    for key, value in lengths.items():
        if value > longest and not _is_set(LONG_MAX_MODEL_LEN, env):
            raise RecipeError(
                f"{key} {value} is longer than the model's context ({source}), which vLLM refuses: set {key} to "
                f"{longest} or less (or remove it), or export {LONG_MAX_MODEL_LEN}=1 if the model handles longer "
                "inputs"
            )
    completion = values.get("max_completion_length")
    if completion is None:  # TRL's default (512) with the tiny model's 256 is refused when the data loads
        return
    if not values.get("use_vllm"):  # TRL's own key counts only with TRL's vLLM
        lengths.pop("vllm_max_model_length", None)
    if lengths:  # as the run measures prompts: the engine's length replaces the model's
        key = min(lengths, key=lengths.get)
        context, source = lengths[key], key
    try:
        prompt_budget(context, completion, source=source)
    except ValueError as exc:
        raise RecipeError(str(exc)) from None


def model_problem(name: str, revision: str | None, env: dict[str, str]) -> str | None:
    """Why this machine cannot load the policy ``name`` (a local folder is ``checks.check_files``'): a packaged model
    not made yet (``hf-grpo model get``), or offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) a hub id whose config
    and weights are not in the hub cache, which the known names and a close one answer. With a hub nothing is asked
    of it here: ``from_pretrained`` downloads it, or says why not."""
    if local_models.resolve(name) is not None:
        return local_models.folder_problem(name)
    if name == "tiny" or name.startswith(("./", "../", "/", "~")) or Path(name).expanduser().exists():
        return None
    try:
        offline = _is_set("HF_HUB_OFFLINE", env) or _is_set("TRANSFORMERS_OFFLINE", env)
        check_hub_id(name, offline=offline, revision=revision)
    except (ValueError, FileNotFoundError) as exc:
        return str(exc)
    return None


def check_hardware(
    values: dict,
    layout: Layout,
    generation: GenerationArguments,
    vllm_standin: bool,
    for_run: bool,
    env: dict[str, str] | None = None,
) -> list[str]:
    """What this machine cannot run (``vllm_standin``: CPU stand-ins may replace vLLM, as in a miniature), the policy
    it cannot load included (``model_problem``; ``env``: the recipe's); for a run (not a dry run) any of it is an
    error, before any model loads."""
    hardware = hardware_problems(values, key_defaults(), layout, generation, vllm_standin=vllm_standin)
    name = values.get("model_name_or_path")
    problem = model_problem(name, values.get("model_revision"), env or {}) if isinstance(name, str) else None
    if problem is not None:
        hardware.append(f"model_name_or_path: {problem}")
    if hardware and for_run:
        hint = "" if vllm_standin else f"; {MINIATURE_HINT}"
        raise RecipeError("this machine cannot run it: " + " | ".join(hardware) + hint)
    return hardware
