"""Errors raised in a worker process, sent back whole: raised in the caller as they were, with
the worker's traceback as their cause."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable

from yogadl_plus.errors import RemoteTraceback, TransformError

__all__ = ["error_payload", "raised_from"]


def error_payload(exc: BaseException) -> bytes:
    """``exc`` as bytes another process can send back, to be raised there by ``raised_from``
    (with its traceback, also when the error itself cannot be pickled)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data: bytes | None = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = None
    return pickle.dumps((data, f"{type(exc).__name__}: {exc}", text))


def raised_from(payload: bytes, what: Callable[[], str]) -> BaseException:
    """The error of an ``error_payload``, to raise here: the worker's own error where it can be
    unpickled, else a TransformError naming ``what()`` failed; the worker's traceback is its
    cause."""
    data, summary, text = pickle.loads(payload)
    exc: BaseException | None = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = TransformError(
            f"a worker process failed on {what()} with {summary} (that error cannot be sent "
            "back as it is; its traceback is the cause)"
        )
    exc.__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
    return exc
