"""``hf-grpo push OUTPUT_DIR user/repo`` (``python -m hf_grpo.push``): push a finished run to the Hugging Face Hub,
the adapter (or merged weights) with its model card (``hf_grpo.publish.hub``; docs/hub.md).

    export HF_TOKEN=hf_...                                   # a token with write access; never put it in a file
    python -m hf_grpo.push outputs/tiny me/tiny-grpo          # the adapter, private repo
    python -m hf_grpo.push outputs/qwen7b me/qwen7b-grpo --merged --public --revision v1

Exit status 2 on a user error, 1 when the Hub refuses the upload or does not answer.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .base.hub_token import env_token, redact
from .publish.hub import DEFAULT_COMMIT_MESSAGE, HubPushError, HubUsageError, push
from .publish.run_result import RunFileError


def main(argv: list[str] | None = None, prog: str = "python -m hf_grpo.push") -> int:
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
