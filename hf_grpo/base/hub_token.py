"""The Hugging Face token: read from the environment only, and never written to a log, a file or the Hub. Also the
Hub's request timeout (``hub_timeout``), which a recipe that pushes checks before it trains."""

from __future__ import annotations

import math
import os
import re


TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # huggingface_hub's order of precedence
# User access tokens are "hf_" + 34 letters/digits; 30+ leaves room for other lengths without matching identifiers
# such as hf_grpo_something.
TOKEN_SHAPE = re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9_])")
TOKEN_SHAPE_TEXT = re.compile(TOKEN_SHAPE.pattern.decode())


TIMEOUT_ENV = "HF_GRPO_HUB_TIMEOUT"  # seconds one request to the Hub may go without an answer (hub_timeout)
DEFAULT_TIMEOUT = 60.0


MOST_SECONDS = 86400


def hub_timeout() -> float:
    """The seconds one request to the Hub may go without an answer: ``HF_GRPO_HUB_TIMEOUT``, else 60;
    ``ValueError`` for a value that is not a number of seconds above 0 and at most a day."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip() or str(DEFAULT_TIMEOUT)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MOST_SECONDS):  # a longer wait overflows the socket's clock
        raise ValueError(
            f"{TIMEOUT_ENV}={raw!r} is not a number of seconds above 0 and at most {MOST_SECONDS} (a day): set it "
            "to e.g. 60, or unset it (60 s by default)"
        )
    return seconds


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
