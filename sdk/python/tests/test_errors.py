"""The exception classes: one per exit code of the CLI's table, the Hub's message kept."""

from __future__ import annotations

import pytest

import agen
from agen.errors import from_code


@pytest.mark.parametrize(
    ("code", "message", "cls"),
    [
        (1, "task t-1 failed", agen.TaskFailed),
        (2, "bundle x is not valid", agen.InvalidArgument),
        (3, "cancelled", agen.Cancelled),
        (4, "deployment nope not found", agen.NotFound),
        (5, "permission denied: viewer", agen.PermissionDenied),
        (5, "the Hub at https://h refused the token: bad", agen.Unauthenticated),
        (6, "cannot reach the Hub", agen.Unavailable),
        (7, "no event within 1s", agen.WaitTimeout),
        (42, "something else", agen.AgenError),
    ],
)
def test_from_code(code: int, message: str, cls: type[agen.AgenError]) -> None:
    e = from_code(code, message)
    assert type(e) is cls and str(e) == message and e.message == message
    assert isinstance(e, agen.AgenError)
    if cls is not agen.AgenError:
        assert e.code == code
