"""Push a finished run to the Hugging Face Hub (``push``; the command: ``hf_grpo.push``): the LoRA adapter (or
merged weights) with a model card.

One commit holds the adapter (or, for a full fine-tune or ``--merged``, the model weights and config), the tokenizer,
the run's reports and per-problem records and ``README.md``, the model card (``hf_grpo.publish.card``); nothing
else. Local paths are replaced by file names in what goes up (``public_files``); the token comes only from the environment, and
every file is scanned for it before anything is sent. Only a finished run of hf_grpo is pushed (``run_problem``), and
a Hub that does not answer ends the push after ``HF_GRPO_HUB_TIMEOUT`` seconds (60) a request (``hub_timeout``).
What goes up and why, the token rules and ``HF_ENDPOINT``: ``docs/hub.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..base import run_files
from ..base.hub_token import TIMEOUT_ENV, TOKEN_SHAPE, env_token, redact
from ..base.hub_token import hub_timeout as _hub_timeout
from ..base.run_files import EVAL_FILE, EVAL_RECORDS, HISTORY_FILE, PLOT_FILE, RECIPE_FILE, SUMMARY_FILE, VERSIONS_FILE
from .card import CARD_FILE, model_card
from .public import public_recipe, public_value, scrub_paths
from .run_result import ADAPTER_FILES, MODEL_SHARD, RunResult, library_versions, run_kind


logger = logging.getLogger("hf_grpo.publish.hub")

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
RUN_FILES = (RECIPE_FILE, EVAL_FILE, HISTORY_FILE, PLOT_FILE, SUMMARY_FILE, VERSIONS_FILE)
DEFAULT_COMMIT_MESSAGE = "Upload GRPO-trained model (hf_grpo)"


class HubUsageError(ValueError):
    """Something the user can fix before a push: missing files, no token, a token inside a file, a bad repo id; the
    CLI exits with 2 (as for a run file that does not parse, ``RunFileError``)."""


class HubPushError(RuntimeError):
    """The Hub (or the network) refused the push or did not answer; the message is one line, already redacted. The CLI
    exits with 1."""


@dataclass
class PushResult:
    repo_id: str
    repo_url: str
    revision: str
    commit_url: str
    private: bool
    merged: bool
    files: list[str] = field(default_factory=list)  # paths in the repo, README.md included
    left_out: list[str] = field(default_factory=list)  # entries of output_dir deliberately not uploaded


# ---------------------------------------------------------------------------------------------------------------------
# Files to upload


def collect_files(output_dir: str | Path, *, weights: bool = True) -> tuple[dict[str, Path], list[str]]:
    """(path in repo -> local file, left-out entries) for ``output_dir``; README.md is never taken from disk."""
    out = Path(output_dir)
    kind = run_kind(out)
    names = list(TOKENIZER_FILES) + list(RUN_FILES)
    names += sorted(p.name for p in out.glob(EVAL_RECORDS.format(label="*")))  # per-problem held-out records
    if weights and kind == "adapter":
        names += list(ADAPTER_FILES)
    elif weights and kind == "model":
        names += list(MODEL_FILES) + sorted(p.name for p in out.iterdir() if MODEL_SHARD.match(p.name))
    files = {name: out / name for name in names if (out / name).is_file()}
    left_out = sorted(
        p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in files and p.name != CARD_FILE
    )
    return dict(sorted(files.items())), left_out


# ---------------------------------------------------------------------------------------------------------------------
# Local paths in the uploaded files (the rule and the helpers are hf_grpo.publish.card's)


JSON_FILES = ("adapter_config.json", "config.json", "generation_config.json", EVAL_FILE, HISTORY_FILE, VERSIONS_FILE)
TOP_LEVEL_JSON_FILES = ("tokenizer_config.json",)  # only top-level values: the added tokens are left as they are


def _public_json(name: str, data: bytes) -> bytes | None:
    try:
        values = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not ours to fix; the token scan still reads it
    if name in TOP_LEVEL_JSON_FILES and isinstance(values, dict):
        public = {k: public_value(v, nested=False) for k, v in values.items()}
    else:
        public = public_value(values)
    return None if public == values else (json.dumps(public, indent=2, ensure_ascii=False) + "\n").encode()


def public_copy(name: str, path: Path) -> bytes | None:
    """What to upload instead of the run's file ``name`` when it names local paths; None to upload it as it is.

    Rewritten: ``recipe.yaml`` (``public_recipe``), ``summary.md`` (``scrub_paths``) and the JSON files hf_grpo,
    PEFT and transformers write (a value that is a local path becomes its file name: ``adapter_config.json``'s
    ``base_model_name_or_path`` of the embedded tiny model is ``base_model``). Not touched: weights, the tokenizer's
    vocabulary, the chat template and the per-problem ``eval_*.jsonl`` records (prompts, references and completions
    as the model saw and wrote them).
    """
    if name in JSON_FILES or name in TOP_LEVEL_JSON_FILES:
        return _public_json(name, path.read_bytes())
    clean = {RECIPE_FILE: public_recipe, SUMMARY_FILE: scrub_paths}.get(name)
    if clean is None:
        return None
    text = path.read_text()
    public = clean(text)
    return None if public == text else public.encode()


def public_files(files: dict[str, Path]) -> dict[str, Path | bytes]:
    """``files`` (path in repo -> local file) with the files that name local paths replaced by cleaned bytes."""
    return {name: path if (cleaned := public_copy(name, path)) is None else cleaned for name, path in files.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Secrets


def _scan_bytes(name: str, data: bytes, token: str | None) -> None:
    if token and len(token) >= 8 and token.encode() in data:
        raise HubUsageError(
            f"refusing to push: {name} contains the value of HF_TOKEN; remove it from the file (and revoke the "
            "token if the file was ever shared), then push again"
        )
    if TOKEN_SHAPE.search(data):
        raise HubUsageError(
            f"refusing to push: {name} contains a string shaped like a Hugging Face access token (hf_ followed by "
            "letters and digits); remove it from the file (and revoke it if it is a real token), then push again"
        )


def _safetensors_header(path: Path) -> bytes:
    """The JSON header of a safetensors file (tensor names, shapes and free-form metadata), not the tensor data."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return f.read(min(size, 100_000_000))


def scan_for_tokens(files: dict[str, Path | bytes], token: str | None) -> None:
    """Raise ``HubUsageError`` naming the first file holding the token or a token-shaped string.

    Every file is read in full except weight files (``*.safetensors``), where only the header with its metadata is
    read: the tensor data is numbers, and a 15 GB merged model should not be read twice.
    """
    for name, source in files.items():
        if isinstance(source, bytes):
            data = source
        elif name.endswith(".safetensors"):
            data = _safetensors_header(source)
        else:
            data = source.read_bytes()
        _scan_bytes(name, data, token)


# ---------------------------------------------------------------------------------------------------------------------
# Merge


def _merge_base(run: RunResult) -> str:
    if (run.output_dir / "base_model").is_dir():
        return str(run.output_dir / "base_model")
    base = (run.adapter_config or {}).get("base_model_name_or_path") or run.values.get("model_name_or_path")
    if not base or base == "tiny":
        raise HubUsageError(
            f"--merged needs the base model, but neither {run.output_dir}/base_model nor adapter_config.json's "
            "base_model_name_or_path nor the recipe's model_name_or_path names it"
        )
    return base


def merge_adapter(run: RunResult, save_dir: str | Path) -> Path:
    """Load the base model and the adapter of ``run``, merge them and save the result (safetensors)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _merge_base(run)
    logger.info("merging the adapter into %s", base)
    model = AutoModelForCausalLM.from_pretrained(
        base,
        revision=run.values.get("model_revision") if not Path(base).exists() else None,
        dtype="auto",
        trust_remote_code=bool(run.values.get("trust_remote_code", False)),
    )
    merged = PeftModel.from_pretrained(model, str(run.output_dir)).merge_and_unload()
    save_dir = Path(save_dir)
    merged.save_pretrained(save_dir, safe_serialization=True)
    return save_dir


# ---------------------------------------------------------------------------------------------------------------------
# Push


FINISHED = "adapter_config.json + adapter_model.safetensors, or config.json + model.safetensors or its shards"
MALFORMED = (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError)  # a file cut short, or not JSON


def _whole_safetensors(path: Path) -> bool:
    """Whether ``path`` is a whole safetensors file: its header parses and the file ends where its header says the
    last tensor's data does (a save cut short by a kill or a full disk leaves it shorter)."""
    try:
        header = json.loads(_safetensors_header(path))
        ends = [int(tensor["data_offsets"][1]) for name, tensor in header.items() if name != "__metadata__"]
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
        return path.stat().st_size == 8 + length + max(ends, default=0)
    except MALFORMED:
        return False


def run_problem(out: Path) -> str | None:
    """Why ``push`` must not upload the folder ``out`` (it is no run of hf_grpo, or one that has not finished), or
    None; checked before anything is sent.

    A run of hf_grpo holds its manifest, ``hf_grpo_run.json``, or is an earlier version's run
    (``run_files.is_run_folder``); a folder another trainer wrote is never uploaded, whatever else it holds. A run
    whose manifest names its phase (``run_files.run_state``) is finished in phase ``finished``; an earlier version's
    run is finished when it holds, whole, the weights training saves into ``output_dir`` after its last step
    (``trainer.save_model``): the adapter (``adapter_config.json`` + ``adapter_model.safetensors``) or the full model
    (``config.json`` + ``model.safetensors``, or every shard ``model.safetensors.index.json`` names), each
    safetensors file as long as its header says. ``checkpoint-N/`` does not count (training part of the way), nor do
    ``eval_results.json`` and the reports: a run trained without the before/after evaluation has none, and the card
    then shows no results.
    """
    if not run_files.is_run_folder(out):
        return (
            f"{out} is not a run of hf_grpo (it has no {run_files.RUN_MANIFEST}, the file `hf-grpo train` writes "
            "first into its output_dir): push only an output_dir that `hf-grpo train` wrote; nothing was sent"
        )
    phase = (run_files.run_state(out) or {}).get("phase")
    if phase in ("trained", "kept"):  # its last weights may yet be replaced by the adapter the watch keeps
        return (f"{out} is a run of hf_grpo that trained but has not finished (its manifest says {phase!r}): finish "
                f"it with `hf-grpo report {shlex.quote(str(out))}`, then push; nothing was sent")  # fmt: skip
    kind, names = run_kind(out), [ADAPTER_FILES[1]]
    if kind == "model":
        names = [p.name for p in out.iterdir() if p.name == "model.safetensors" or MODEL_SHARD.match(p.name)]
        with contextlib.suppress(*MALFORMED):  # no index, or one that does not parse: the shards that are there
            names += map(str, json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values())
    missing = None if kind else f"it holds no trained weights ({FINISHED})"
    if phase == "training":  # weights in the folder, if any, are an earlier training's
        missing = "it was stopped while it trained (its manifest says 'training')"
    for name in sorted(set(names)) if kind else []:
        if not (out / name).is_file():
            missing = missing or f"{name}, which model.safetensors.index.json names, is missing"
        elif not _whole_safetensors(out / name):
            missing = missing or f"{name} is cut short (saving it was interrupted)"
    if missing is None:
        return None
    recipe = shlex.quote(str(out / RECIPE_FILE)) if (out / RECIPE_FILE).is_file() else "RECIPE"  # written first
    return (
        f"{out} is a run of hf_grpo that has not finished: {missing}; finish it with `hf-grpo train {recipe} "
        f"--output_dir {shlex.quote(str(out))} --resume_from_checkpoint auto` (it resumes from its last complete "
        "checkpoint), then push; nothing was sent"
    )


def _check_output_dir(output_dir: Path, merged: bool) -> None:
    if not output_dir.is_dir():
        raise HubUsageError(f"output directory {str(output_dir)!r} does not exist; pass the output_dir of a run")
    problem = run_problem(output_dir)
    if problem:
        raise HubUsageError(problem)
    if merged and run_kind(output_dir) != "adapter":
        raise HubUsageError(f"--merged needs a LoRA adapter, but {output_dir} holds full model weights; drop --merged")


def _check_push(output_dir: Path, repo_id: str, merged: bool) -> str:
    """The token, once everything the user can fix before a push is fine (``HubUsageError`` otherwise)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    _check_output_dir(output_dir, merged)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubUsageError(f"invalid repo id {repo_id!r}: {exc}") from None
    token = env_token()
    if token is None:
        raise HubUsageError(
            "no Hugging Face token in the environment: export HF_TOKEN=hf_... (a token with write access, from "
            "https://huggingface.co/settings/tokens); hf_grpo never reads tokens from files or arguments"
        )
    if constants.is_offline_mode():
        raise HubUsageError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set; unset it to push to the Hub")
    return token


def _uploads(run: RunResult, card: bytes, token: str, merged: bool, tmp: str) -> tuple[dict, list[str]]:
    """(path in repo -> bytes or file, left-out entries): the card first, every file scanned for the token."""
    found, left_out = collect_files(run.output_dir, weights=not merged)
    scan_for_tokens(found, token)  # before anything is sent; the files first, since the card quotes some
    files = public_files(found)  # local paths replaced by file names (recipe.yaml, adapter_config.json, ...)
    scan_for_tokens(files, token)  # what is actually sent
    uploads: dict[str, Path | bytes] = {CARD_FILE: card}
    scan_for_tokens(uploads, token)
    if merged:  # after the cheap checks: merging a large model takes a while
        merged_dir = merge_adapter(run, tmp)
        found = {p.name: p for p in merged_dir.iterdir() if p.name in MODEL_FILES or MODEL_SHARD.match(p.name)}
        weights = public_files(found)
        scan_for_tokens(weights, token)
        files.update(weights)
    uploads.update(sorted(files.items()))
    return uploads, left_out


def push(
    output_dir: str | Path,
    repo_id: str,
    *,
    private: bool = True,
    merged: bool = False,
    revision: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    license: str | None = None,
    run: RunResult | None = None,
) -> PushResult:
    """Create ``repo_id`` (if needed) and upload the run in ``output_dir`` to it in one commit.

    The token is read from the environment (``HF_TOKEN``) and the endpoint from ``HF_ENDPOINT``, both at call time.
    ``license`` (a Hub license id such as ``apache-2.0``) goes into the card's metadata (``resolve_license``). ``run``
    is the run's result when the caller holds it (the training run), else it is read (``RunResult.load``).
    Raises ``HubUsageError`` for what the user can fix (before anything is sent: ``run_problem``, ``hub_timeout``),
    ``RunFileError`` for a run file that does not parse, and ``HubPushError`` when the Hub refuses or a request gets
    no answer within ``hub_timeout()`` seconds; no message contains the token.
    """
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    out = Path(output_dir)
    token, timeout = _check_push(out, repo_id, merged), hub_timeout()  # both before anything is sent
    run = run or RunResult.load(out)
    revision = revision or None
    with tempfile.TemporaryDirectory(prefix="hf_grpo_merged_") as tmp:
        card = model_card(run, repo_id, merged=merged, license=license).encode()
        uploads, left_out = _uploads(run, card, token, merged, tmp)
        endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        version = library_versions()["hf_grpo"]
        api = HfApi(endpoint=endpoint, token=token, library_name="hf_grpo", library_version=version)
        with _requests_time_out(timeout):
            with _hub_errors(repo_id, token, endpoint, timeout):
                repo_url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
            full_id = repo_url.repo_id or repo_id
            if full_id != repo_id:  # "name" alone lands in the token owner's namespace: the card shows the real id
                uploads[CARD_FILE] = model_card(run, full_id, merged=merged, license=license).encode()
                scan_for_tokens({CARD_FILE: uploads[CARD_FILE]}, token)
            with _hub_errors(full_id, token, endpoint, timeout):
                if revision and revision != "main":
                    api.create_branch(full_id, branch=revision, repo_type="model", exist_ok=True)
                operations = [CommitOperationAdd(n, s if isinstance(s, bytes) else str(s)) for n, s in uploads.items()]
                logger.info("uploading %d files to %s", len(operations), full_id)
                info = api.create_commit(
                    full_id, operations, commit_message=commit_message, repo_type="model", revision=revision
                )
    return PushResult(
        repo_id=full_id,
        repo_url=str(repo_url),
        revision=revision or "main",
        commit_url=str(info.commit_url),
        private=private,
        merged=merged,
        files=list(uploads),
        left_out=left_out,
    )


def hub_timeout() -> float:
    """``hub_token.hub_timeout`` (``HF_GRPO_HUB_TIMEOUT``, else 60 s), a bad value as ``HubUsageError``."""
    try:
        return _hub_timeout()
    except ValueError as exc:
        raise HubUsageError(str(exc)) from None


@contextlib.contextmanager
def _requests_time_out(seconds: float):
    """For the block, huggingface_hub's shared HTTP client (``set_client_factory``) is the one it would build, with
    ``seconds`` as the limit of every step of a request: connecting, waiting for a free connection, and each read and
    write (so a large upload that keeps moving is never cut, and a Hub that stops answering is). Its own default
    waits forever. The factory of before is put back afterwards (the shared client is rebuilt from it)."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http  # the installed factory has no public getter

    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", _http.default_client_factory)

    def with_timeout():
        client = previous()
        client.timeout = seconds
        return client

    set_client_factory(with_timeout)
    try:
        yield
    finally:
        set_client_factory(previous)


@contextlib.contextmanager
def _hub_errors(repo_id: str, token: str, endpoint: str, timeout: float):
    """Turn a failure of the Hub client (an HTTP error answer, the network, no answer within ``timeout``, an answer
    it cannot read) into ``HubPushError``: one line naming the endpoint, the token scrubbed from it."""
    import httpx2  # huggingface_hub's HTTP client; its errors (HfHubHTTPError is one) derive from these

    try:
        yield
    except httpx2.TimeoutException:
        message = (
            f"push to {repo_id} failed: the Hub at {endpoint} (HF_ENDPOINT) did not answer within {timeout:g} s "
            f"({TIMEOUT_ENV}); check that HF_ENDPOINT is right and reachable, or raise {TIMEOUT_ENV} on a slow "
            "connection"
        )
        raise HubPushError(redact(message, token)) from None
    except (httpx2.HTTPError, httpx2.InvalidURL, OSError, ValueError) as exc:
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        message = f"push to {repo_id} at {endpoint} (HF_ENDPOINT) failed: {type(exc).__name__}: {detail}"
        raise HubPushError(redact(message, token)) from None


# ---------------------------------------------------------------------------------------------------------------------
# Command line
