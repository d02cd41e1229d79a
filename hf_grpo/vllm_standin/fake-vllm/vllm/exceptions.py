"""vLLM 0.30's exception classes that the stand-in raises (``vllm/exceptions.py``)."""

from typing import Any


class VLLMError(Exception):
    """Base class of vLLM's own errors."""


class VLLMClientError(VLLMError):
    """An error caused by the request (a 4xx on a server)."""


class VLLMServerError(VLLMError):
    """An error caused by the server (a 5xx)."""


class VLLMValidationError(VLLMClientError):
    """A request value failed validation; ``parameter`` and ``value`` name it when known."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base
