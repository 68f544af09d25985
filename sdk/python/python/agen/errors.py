"""The exceptions of the Agen SDK: one class per row of the CLI's exit-code table.

Every error carries the message the Hub (or the harness) gave, and ``code``: the exit code
``agen`` would end with for the same failure (``docs/exit-codes.md``).
"""

from __future__ import annotations


class AgenError(Exception):
    """Base class of every Agen error (exit code 1 when no subclass fits)."""

    code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TaskFailed(AgenError):
    """The task (or run) failed, or the call failed for a reason no other class names (1)."""

    code = 1


class InvalidArgument(AgenError):
    """Bad arguments or input: a bad bundle, a bad flag value, no Hub configured (2)."""

    code = 2


class Cancelled(AgenError):
    """The task was cancelled (3)."""

    code = 3


class NotFound(AgenError):
    """No such task, deployment, artifact or run (4)."""

    code = 4


class PermissionDenied(AgenError):
    """The token may not do this, or the Hub's certificate is not trusted (5)."""

    code = 5


class Unauthenticated(PermissionDenied):
    """The Hub refused the token (5)."""

    code = 5


class Unavailable(AgenError):
    """The Hub cannot be reached or is stopping; retrying later may help (6)."""

    code = 6


class WaitTimeout(AgenError):
    """A wait ended before the task did (7)."""

    code = 7


_BY_CODE: dict[int, type[AgenError]] = {
    1: TaskFailed,
    2: InvalidArgument,
    3: Cancelled,
    4: NotFound,
    5: PermissionDenied,
    6: Unavailable,
    7: WaitTimeout,
}


def from_code(code: int, message: str) -> AgenError:
    """The exception for exit code ``code`` carrying ``message`` (used by the native module)."""
    if code == 5 and "refused the token" in message:
        return Unauthenticated(message)
    return _BY_CODE.get(code, AgenError)(message)
