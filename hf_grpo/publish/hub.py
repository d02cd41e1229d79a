"""Push a finished run to the Hugging Face Hub: the LoRA adapter (or merged weights) with a model card.

    export HF_TOKEN=hf_...                                            # a token with write access; never in a file
    python -m hf_grpo.publish.hub outputs/tiny me/tiny-grpo           # = hf-grpo push; the adapter, private repo

One commit holds the adapter (or, for a full fine-tune or ``--merged``, the model weights and config), the tokenizer,
the run's reports and per-problem records and ``README.md``, the model card (``hf_grpo.publish.card``); nothing
else. Local paths are replaced by file names in what goes up (``public_files``); the token comes only from the environment, and
every file is scanned for it before anything is sent. Only a finished run of hf_grpo is pushed (``run_problem``), and
a Hub that does not answer ends the push after ``HF_GRPO_HUB_TIMEOUT`` seconds (60) a request (``hub_timeout``).
The command exits with 2 on a user error and 1 when the Hub refuses or does not answer. What goes up and why, the
token rules and ``HF_ENDPOINT``: ``docs/hub.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..base import run_files
from ..base.hub_token import TIMEOUT_ENV, env_token, redact
from ..base.hub_token import hub_timeout as _hub_timeout
from ..base.run_files import RECIPE_FILE
from .card import CARD_FILE, model_card
from .run_result import ADAPTER_FILES, MODEL_SHARD, RunFileError, RunResult, library_versions, run_kind
from .uploads import (
    MODEL_FILES,
    HubUsageError,
    _safetensors_header,
    collect_files,
    merge_adapter,
    public_files,
    scan_for_tokens,
)


logger = logging.getLogger("hf_grpo.publish.hub")

DEFAULT_COMMIT_MESSAGE = "Upload GRPO-trained model (hf_grpo)"


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
# The command line


def main(argv: list[str] | None = None, prog: str = "python -m hf_grpo.publish.hub") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Push a finished hf_grpo run (adapter or merged model, with a model card) to the Hugging Face "
        "Hub. The token is read from the HF_TOKEN environment variable only.",
    )
    parser.add_argument("output_dir", help="the output_dir of a finished run")
    parser.add_argument("repo_id", help="Hub repository, e.g. me/qwen7b-grpo (created if missing)")
    parser.add_argument("--merged", action="store_true", help="merge the LoRA adapter into its base and push that")
    parser.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    parser.add_argument("--revision", default=None, help="branch to commit to (created if missing; default main)")
    parser.add_argument("-m", "--message", default=DEFAULT_COMMIT_MESSAGE, help="commit message")
    parser.add_argument(
        "--license",
        default=None,
        help="license id for the card's metadata, e.g. apache-2.0 (default: apache-2.0 for the embedded tiny model, "
        "else none: the base model's license applies and is not known offline)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        result = push(
            args.output_dir,
            args.repo_id,
            private=not args.public,
            merged=args.merged,
            revision=args.revision,
            commit_message=args.message,
            license=args.license,
        )
    except (HubUsageError, RunFileError) as exc:
        print(f"{prog}: error: {redact(str(exc), env_token())}", file=sys.stderr)  # noqa: T201
        return 2
    except HubPushError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    visibility = "private" if result.private else "public"
    what = "merged model" if result.merged else "run"
    print(f"pushed the {what} to {result.repo_url} (revision {result.revision}; {visibility} if newly created)")  # noqa: T201
    print(f"uploaded {len(result.files)} files:")  # noqa: T201
    for name in result.files:
        print(f"  {name}")  # noqa: T201
    if result.left_out:
        print(f"left out: {', '.join(result.left_out)}")  # noqa: T201
    print(f"commit: {result.commit_url}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
