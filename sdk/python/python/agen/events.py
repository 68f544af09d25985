"""Typed events of a run: what a fleet task's ``task.events()`` and an embedded agent's
``agent.stream()`` yield.

Both come from the same run contract (``shared/src/run``); a fleet event also has ``seq`` (its
place in the task's history, each given once and in order) and ``task`` (the task's snapshot
after it). Kinds this version does not know arrive as :class:`Other`.

:class:`TextDelta` and :class:`TextReset` are not events of the run's history: they are the
model's answer as it streams (``task.stream()``, ``task.events(deltas=True)``), never stored,
``seq`` 0. The text after a turn's last reset is what that turn's :class:`ModelAnswered` holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypedDict


@dataclass(frozen=True)
class Event:
    """Fields every event has: its ``kind``, and for fleet events ``seq`` and ``at_ms``."""

    kind: str
    seq: int | None
    at_ms: int | None
    body: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class ModelRequested(Event):
    """A model request is about to be sent (``turn`` counts from 1)."""

    turn: int | None = None


@dataclass(frozen=True)
class ModelAnswered(Event):
    """The model answered a turn: its text, the tool calls it asked for, the tokens used."""

    turn: int | None = None
    text: str = ""
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ToolStarted(Event):
    """A tool call is about to be made; ``side_effect`` says whether the ledger counts it as
    one (durable in the run log before the call, never repeated once completed)."""

    call_id: str = ""
    tool: str = ""
    arguments: Any = None
    side_effect: bool = True


@dataclass(frozen=True)
class ToolCompleted(Event):
    """A tool call answered (``is_error``: the tool reported an error). ``side_effect`` is the
    effect its start reported, when that start was seen by this stream."""

    call_id: str = ""
    tool: str = ""
    result: str = ""
    is_error: bool = False
    duration_ms: int = 0
    side_effect: bool | None = None


@dataclass(frozen=True)
class ToolFailed(Event):
    """A tool call did not answer: ``reason`` is ``timeout``, ``cancelled``, ``failed``,
    ``effect_unknown`` (a crash interrupted a side-effecting call), …"""

    call_id: str = ""
    tool: str = ""
    error: str = ""
    reason: str = ""
    duration_ms: int = 0
    side_effect: bool | None = None


@dataclass(frozen=True)
class Progress(Event):
    """A ``report_progress`` call of the agent."""

    step: str = ""
    done: int | None = None
    total: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class Activity(Event):
    """What the run is doing now, when a model or tool event does not say it."""

    activity: str = ""


@dataclass(frozen=True)
class ApprovalWaiting(Event):
    """An ``ask`` call waits for a decision (``Client.approve`` / ``Client.deny``)."""

    call_id: str = ""
    tool: str = ""
    arguments: Any = None


@dataclass(frozen=True)
class ApprovalDecided(Event):
    """An ``ask`` call was decided."""

    call_id: str = ""
    approved: bool = False
    reason: str = ""
    by: str = ""


@dataclass(frozen=True)
class ChildStarted(Event):
    """The run started a child task on delegate ``agent`` (``call_agent``) and waits for it
    (``Client.task(task_id)`` follows the child). Also given when the run gives its slot back
    while it waits (then with ``call_id`` and without ``agent``)."""

    task_id: str = ""
    agent: str = ""
    call_id: str = ""


@dataclass(frozen=True)
class ArtifactSaved(Event):
    """The agent saved an artifact."""

    artifact_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class TaskState(Event):
    """A fleet task changed state (``queued``, ``running``, ``waiting``, ``succeeded``,
    ``failed``, ``cancelled``); the last event of a task is a terminal one."""

    state: str = ""
    message: str = ""
    result: str | None = None
    error: str = ""


@dataclass(frozen=True)
class Finished(Event):
    """The run finished (``state``: ``succeeded``, ``failed``, ``cancelled``)."""

    state: str = ""
    result: str = ""


@dataclass(frozen=True)
class TextDelta(Event):
    """The next piece of model turn ``turn``'s answer (of run attempt ``attempt``) as it
    streams. Not durable: ``seq`` is 0, and a piece may be lost to a dropped connection (then
    a :class:`TextReset` carries the turn so far)."""

    attempt: int = 0
    turn: int = 0
    text: str = ""


@dataclass(frozen=True)
class TextReset(Event):
    """Drop what was shown of turn ``turn`` and of every later turn: the turn was cut off (a
    crash, a resume, a provider's retry) and is asked again, or this stream attached late.
    ``text`` is the turn's new beginning (often empty)."""

    attempt: int = 0
    turn: int = 0
    text: str = ""


@dataclass(frozen=True)
class Other(Event):
    """An event of a kind this version does not type (``kind`` and ``body`` say all)."""


# The harness's activity once a delegate's child task exists (nest/harness/src/run/delegate.rs).
_WAITING_FOR_CHILD = re.compile(r"^waiting for task (\S+) on (\S+)$")


class _Base(TypedDict):
    kind: str
    seq: int | None
    at_ms: int | None
    body: dict[str, Any]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def parse(
    kind: str,
    body: Any,
    *,
    seq: int | None = None,
    at_ms: int | None = None,
    effects: dict[str, bool] | None = None,
) -> Event:
    """The typed event of ``kind`` with JSON ``body``; ``effects`` remembers each started
    call's side effect so a completion can carry it."""
    b: dict[str, Any] = body if isinstance(body, dict) else {"value": body}
    base: _Base = {"kind": kind, "seq": seq, "at_ms": at_ms, "body": b}
    fx = effects if effects is not None else {}
    if kind == "model.requested":
        return ModelRequested(**base, turn=_int(b.get("turn")))
    if kind == "model.answered":
        msg = b.get("message") if isinstance(b.get("message"), dict) else {}
        usage = b.get("usage") if isinstance(b.get("usage"), dict) else {}
        assert isinstance(msg, dict) and isinstance(usage, dict)
        calls = msg.get("tool_calls")
        return ModelAnswered(
            **base,
            turn=_int(b.get("turn")),
            text=_str(msg.get("content")),
            tool_calls=len(calls) if isinstance(calls, list) else 0,
            input_tokens=_int(usage.get("input_tokens")) or 0,
            output_tokens=_int(usage.get("output_tokens")) or 0,
        )
    if kind == "tool.started":
        side_effect = b.get("side_effect", True) is not False
        fx[_str(b.get("call_id"))] = side_effect
        return ToolStarted(
            **base,
            call_id=_str(b.get("call_id")),
            tool=_str(b.get("tool")),
            arguments=b.get("arguments"),
            side_effect=side_effect,
        )
    if kind == "tool.completed":
        return ToolCompleted(
            **base,
            call_id=_str(b.get("call_id")),
            tool=_str(b.get("tool")),
            result=_str(b.get("result")),
            is_error=b.get("is_error") is True,
            duration_ms=_int(b.get("duration_ms")) or 0,
            side_effect=fx.get(_str(b.get("call_id"))),
        )
    if kind == "tool.failed":
        return ToolFailed(
            **base,
            call_id=_str(b.get("call_id")),
            tool=_str(b.get("tool")),
            error=_str(b.get("error")),
            reason=_str(b.get("reason")),
            duration_ms=_int(b.get("duration_ms")) or 0,
            side_effect=fx.get(_str(b.get("call_id"))),
        )
    if kind in ("task.progress", "progress.latest"):
        note = b.get("note")
        return Progress(
            **base,
            step=_str(b.get("step")),
            done=_int(b.get("done")),
            total=_int(b.get("total")),
            note=note if isinstance(note, str) else None,
        )
    if kind == "activity":
        child = _WAITING_FOR_CHILD.match(_str(b.get("activity")))
        if child:
            return ChildStarted(**base, task_id=child.group(1), agent=child.group(2))
        return Activity(**base, activity=_str(b.get("activity")))
    if kind == "approval.requested":
        return ApprovalWaiting(
            **base,
            call_id=_str(b.get("call_id")),
            tool=_str(b.get("tool")),
            arguments=b.get("arguments"),
        )
    if kind == "approval.decided":
        return ApprovalDecided(
            **base,
            call_id=_str(b.get("call_id")),
            approved=b.get("approved") is True,
            reason=_str(b.get("reason")),
            by=_str(b.get("by")),
        )
    if kind == "run.suspended":
        waiting = b.get("waiting_for")
        if isinstance(waiting, dict) and waiting.get("type") == "child":
            return ChildStarted(
                **base,
                task_id=_str(waiting.get("task_id")),
                call_id=_str(waiting.get("call_id")),
            )
    if kind == "artifact.saved":
        return ArtifactSaved(
            **base,
            artifact_id=_str(b.get("artifact_id") or b.get("id")),
            name=_str(b.get("name")),
        )
    if kind == "task.state":
        result = b.get("result")
        return TaskState(
            **base,
            state=_str(b.get("state")),
            message=_str(b.get("message")),
            result=result if isinstance(result, str) else None,
            error=_str(b.get("error")),
        )
    if kind == "run.finished":
        return Finished(**base, state=_str(b.get("state")), result=_str(b.get("result")))
    if kind in ("model.delta", "delta.reset"):
        attempt, turn, text = _int(b.get("attempt")) or 0, _int(b.get("turn")) or 0, _str(b.get("text"))
        if kind == "delta.reset" or b.get("reset") is True:
            return TextReset(**base, attempt=attempt, turn=turn, text=text)
        return TextDelta(**base, attempt=attempt, turn=turn, text=text)
    return Other(**base)
