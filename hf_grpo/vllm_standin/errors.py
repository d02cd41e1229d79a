"""The stand-in server's errors, answered as vLLM answers them: a status and ``{"error": {...}}`` or ``{"detail"}``."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered the way vLLM answers it: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


class NoRoute(Exception):
    """No such route (404) or not with this method (405): answered ``{"detail": ...}`` as FastAPI does."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def api_error_from(exc: Exception) -> ApiError:
    """vLLM's fallback mapping of a raw exception to a status (``serve/exception_handling/error_response.py``)."""
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return ApiError(400, str(exc), "BadRequestError")
    if isinstance(exc, NotImplementedError):
        return ApiError(501, str(exc), "NotImplementedError")
    return ApiError(500, str(exc) or type(exc).__name__, "InternalServerError")
