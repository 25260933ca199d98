"""Failure classification: explicit classes, HTTP-like statuses, exception types."""

from __future__ import annotations

import asyncio

import pytest
from loopwatch.instrumentation import FailureClass, ToolFailure, classify_exception
from loopwatch.instrumentation.failures import retry_allowance


class HTTPError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class ClientError(Exception):
    def __init__(self, status: int) -> None:
        self.response = Response(status)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ToolFailure("x", "unauthorized"), FailureClass.UNAUTHORIZED),
        (HTTPError(401), FailureClass.UNAUTHORIZED),
        (HTTPError(422), FailureClass.INVALID_ARGUMENTS),
        (HTTPError(429), FailureClass.TRANSIENT),
        (HTTPError(503), FailureClass.TRANSIENT),
        (HTTPError(504), FailureClass.TIMEOUT),
        (ClientError(403), FailureClass.UNAUTHORIZED),
        (TimeoutError(), FailureClass.TIMEOUT),
        (asyncio.CancelledError(), FailureClass.TIMEOUT),
        (ConnectionResetError(), FailureClass.TRANSIENT),
        (PermissionError(), FailureClass.UNAUTHORIZED),
        (ValueError(), FailureClass.INVALID_ARGUMENTS),
        (KeyError("k"), FailureClass.INVALID_ARGUMENTS),
        (RuntimeError(), FailureClass.PERMANENT),
    ],
)
def test_classify(exc: BaseException, expected: FailureClass) -> None:
    assert classify_exception(exc) is expected


def test_unknown_failure_class_is_refused() -> None:
    with pytest.raises(ValueError):
        ToolFailure("x", "flaky")


@pytest.mark.parametrize(
    ("fc", "write", "key", "expected"),
    [
        (FailureClass.TRANSIENT, False, False, 3),
        (FailureClass.TIMEOUT, False, False, 3),
        (FailureClass.TIMEOUT, True, False, 0),
        (FailureClass.TIMEOUT, True, True, 3),
        (FailureClass.TRANSIENT, True, False, 0),
        (FailureClass.INVALID_ARGUMENTS, False, False, 0),
        (FailureClass.UNAUTHORIZED, False, False, 0),
        (FailureClass.UNKNOWN_TOOL, False, False, 0),
        (FailureClass.PERMANENT, False, False, 0),
    ],
)
def test_retry_allowance(fc: FailureClass, write: bool, key: bool, expected: int) -> None:
    assert retry_allowance(fc, write=write, has_idempotency_key=key, max_retries=3) == expected
