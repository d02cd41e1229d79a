"""The Hugging Face token: read from the environment only, and never written to a log, a file or the Hub."""

from __future__ import annotations

import os
import re


TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # huggingface_hub's order of precedence
# User access tokens are "hf_" + 34 letters/digits; 30+ leaves room for other lengths without matching identifiers
# such as hf_grpo_something.
TOKEN_SHAPE = re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9_])")
TOKEN_SHAPE_TEXT = re.compile(TOKEN_SHAPE.pattern.decode())


def env_token() -> str | None:
    """The Hub token from the environment, as huggingface_hub reads it (``HF_TOKEN``, then the old name)."""
    for name in TOKEN_ENV:
        value = (os.environ.get(name) or "").strip()
        if value:
            return value
    return None


def redact(text: str, token: str | None) -> str:
    """``text`` with the token and anything token-shaped replaced."""
    if token:
        text = text.replace(token, "<redacted>")
    return TOKEN_SHAPE_TEXT.sub("hf_<redacted>", text)
