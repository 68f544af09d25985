"""The fleet client: deploy bundles, submit tasks and follow them on an Agen Hub.

``Client`` connects as the ``agen`` CLI does (the same Rust client code): each argument left
out comes from ``AGEN_HUB``, ``AGEN_TOKEN``, ``AGEN_CA_FILE``, ``AGEN_NAMESPACE``, then the client
config (``$AGEN_CONFIG``, else ``~/.config/agen/config.toml``, written by ``agen up``).
``AsyncClient`` is the same API for ``asyncio``: every call runs in a worker thread with the
GIL released, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from datetime import datetime
from typing import Any, Literal

from . import _native
from .errors import Cancelled, TaskFailed, WaitTimeout
from .events import Event, TextDelta, TextReset, parse

StrPath = str | os.PathLike[str]

_TERMINAL = ("succeeded", "failed", "cancelled")

DoubleTexting = Literal["reject", "enqueue", "interrupt", "rollback"]
"""What a submit does when its conversation already has a task queued or running."""


def _time(v: Any) -> datetime | None:
    """An RFC 3339 time of the Hub's JSON (``…Z``), or ``None``."""
    return datetime.fromisoformat(v.replace("Z", "+00:00")) if isinstance(v, str) and v else None


@dataclass(frozen=True)
class Deployment:
    """A deployment: its bundle, replicas and (when fetched one by one) its instances."""

    name: str
    namespace: str
    generation: int
    replicas: int
    ready_replicas: int
    bundle_digest: str
    raw: dict[str, Any] = field(repr=False)

    @staticmethod
    def _of(v: dict[str, Any]) -> Deployment:
        return Deployment(
            name=str(v.get("name", "")),
            namespace=str(v.get("namespace", "")),
            generation=int(v.get("generation") or 0),
            replicas=int(v.get("replicas") or 0),
            ready_replicas=int(v.get("ready_replicas") or v.get("ready") or 0),
            bundle_digest=str(v.get("bundle_digest") or v.get("bundle") or ""),
            raw=v,
        )

    @property
    def warnings(self) -> list[str]:
        """What ``deploy`` warned about without refusing the bundle (as ``agen deploy`` prints:
        servers fetched unpinned, Keen tools that cannot run as registered)."""
        got = self.raw.get("warnings")
        return [str(w) for w in got] if isinstance(got, list) else []

    @property
    def instances(self) -> list[dict[str, Any]]:
        """The deployment's instances as ``agen ps --all -o json`` shows them."""
        got = self.raw.get("instances")
        return got if isinstance(got, list) else []


@dataclass(frozen=True)
class Approval:
    """A pending (or just decided) ``ask`` call."""

    task_id: str
    deployment: str
    call_id: str
    tool: str
    arguments: Any
    approved: bool | None = None
    reason: str = ""

    @staticmethod
    def _of(v: dict[str, Any]) -> Approval:
        approved = v.get("approved")
        return Approval(
            task_id=str(v.get("task", "")),
            deployment=str(v.get("deployment", "")),
            call_id=str(v.get("call_id", "")),
            tool=str(v.get("tool", "")),
            arguments=v.get("arguments"),
            approved=approved if isinstance(approved, bool) else None,
            reason=str(v.get("reason") or ""),
        )


@dataclass(frozen=True)
class Artifact:
    """An artifact an agent saved (``id`` is ``sha256:<hex>``)."""

    id: str
    name: str
    media_type: str
    size: int
    task_id: str


@dataclass(frozen=True)
class Span:
    """One span of a task's trace: a model turn, a tool call, the run."""

    span_id: str
    parent_span_id: str
    name: str
    start_ms: int
    end_ms: int
    status: str
    attributes: dict[str, str]


@dataclass(frozen=True)
class Trace:
    """A task's trace."""

    task_id: str
    trace_id: str
    spans: list[Span]


@dataclass(frozen=True)
class Schedule:
    """A schedule: deployment ``deployment`` gets a task with ``input`` at every slot of
    ``cron`` read in ``timezone``; each firing is a task labelled ``agen.schedule`` (its id)
    and ``agen.schedule.slot``."""

    schedule_id: str
    deployment: str
    cron: str
    timezone: str
    input: str
    conversation_key: str
    overlap: str
    catch_up: str
    paused: bool
    next_slot: datetime | None
    last_slot: datetime | None
    last_task_id: str
    raw: dict[str, Any] = field(repr=False)

    @staticmethod
    def _of(v: dict[str, Any]) -> Schedule:
        return Schedule(
            schedule_id=str(v.get("schedule_id", "")),
            deployment=str(v.get("deployment", "")),
            cron=str(v.get("cron", "")),
            timezone=str(v.get("timezone", "")),
            input=str(v.get("input", "")),
            conversation_key=str(v.get("conversation_key") or ""),
            overlap=str(v.get("overlap", "")),
            catch_up=str(v.get("catch_up", "")),
            paused=v.get("paused") is True,
            next_slot=_time(v.get("next_slot")),
            last_slot=_time(v.get("last_slot")),
            last_task_id=str(v.get("last_task_id") or ""),
            raw=v,
        )


@dataclass(frozen=True)
class WebhookDelivery:
    """One webhook delivery of a task (``event``: ``task.ended`` or ``task.waiting``;
    ``state``: ``pending``, ``delivered`` or ``failed``) and how its attempts went."""

    delivery_id: str
    url: str
    event: str
    state: str
    attempts: int
    last_status: int
    last_error: str
    delivered_at: datetime | None

    @staticmethod
    def _of(v: dict[str, Any]) -> WebhookDelivery:
        return WebhookDelivery(
            delivery_id=str(v.get("delivery_id", "")),
            url=str(v.get("url", "")),
            event=str(v.get("event", "")),
            state=str(v.get("state", "")),
            attempts=int(v.get("attempts") or 0),
            last_status=int(v.get("last_status") or 0),
            last_error=str(v.get("last_error") or ""),
            delivered_at=_time(v.get("delivered_at")),
        )


def _env(value: Any, name: str) -> Any:
    if value is not None:
        return value
    got = os.environ.get(name)
    return got if got else None


class Task:
    """A task on the Hub: a snapshot of it (``state``, ``result``, ``error``) and the calls
    that follow it. ``refresh()`` fetches it again; ``wait()`` follows it to its end."""

    def __init__(self, client: Client, snapshot: dict[str, Any]) -> None:
        self._client = client
        self._snap = snapshot

    def __repr__(self) -> str:
        return f"Task(id={self.id!r}, deployment={self.deployment!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        """The task id."""
        return str(self._snap.get("task_id", ""))

    @property
    def deployment(self) -> str:
        """The deployment that runs it."""
        return str(self._snap.get("deployment", ""))

    @property
    def state(self) -> str:
        """``queued``, ``running``, ``waiting``, ``succeeded``, ``failed`` or ``cancelled``."""
        return str(self._snap.get("state", ""))

    @property
    def done(self) -> bool:
        """Whether the task has ended."""
        return self.state in _TERMINAL

    @property
    def result(self) -> str | None:
        """The answer (or what went wrong) once the task ended, else ``None``."""
        o = self._snap.get("outcome")
        return str(o.get("result", "")) if isinstance(o, dict) else None

    @property
    def error(self) -> str | None:
        """Why the task failed or was cancelled, once it did."""
        o = self._snap.get("outcome")
        e = o.get("error") if isinstance(o, dict) else None
        return e if isinstance(e, str) else None

    @property
    def warnings(self) -> list[str]:
        """What the Hub warned about at submit (e.g. an override that matched no tool)."""
        w = self._snap.get("warnings")
        return [str(x) for x in w] if isinstance(w, list) else []

    @property
    def raw(self) -> dict[str, Any]:
        """The task as ``agen query -o json`` shows it."""
        return self._snap

    def refresh(self) -> Task:
        """Fetches the task again (this object is updated and returned)."""
        self._snap = json.loads(self._client._hub.task(self.id))
        return self

    def events(self, from_seq: int = 0, *, deltas: bool = False) -> Iterator[Event]:
        """The task's events from ``from_seq`` to its end, each once and in order, also when
        the stream to the Hub drops on the way (it attaches again where it stopped). With
        ``deltas``, the model's answer as it streams too (:class:`~agen.events.TextDelta`,
        :class:`~agen.events.TextReset`; not durable, ``seq`` 0)."""
        stream = self._client._hub.watch(self.id, from_seq, deltas)
        effects: dict[str, bool] = {}
        while True:
            got = stream.next()
            if got is None:
                return
            yield self._event(got, effects)

    def stream(self) -> Iterator[TextDelta | TextReset]:
        """The model's answer as it is written, until the task ends (then ``result`` is
        fresh): :class:`~agen.events.TextDelta` pieces, and a :class:`~agen.events.TextReset`
        when a turn was cut off (a crash, a resume) and is asked again, or when this stream
        attached after the turn began: drop what you showed of that turn and of later ones,
        then show the reset's ``text``. The text after a turn's last reset is its answer."""
        for event in self.events(deltas=True):
            if isinstance(event, (TextDelta, TextReset)):
                yield event

    def webhooks(self) -> list[WebhookDelivery]:
        """The task's webhook deliveries, each with its attempts (``agen tasks webhooks``)."""
        return self._client.task_webhooks(self.id)

    def _event(self, got: str, effects: dict[str, bool]) -> Event:
        v = json.loads(got)
        if isinstance(v.get("task"), dict):
            self._snap = v["task"]
        return parse(v["kind"], v.get("body"), seq=v.get("seq"), at_ms=v.get("at_ms"), effects=effects)

    def wait(self, timeout: float | None = None) -> str:
        """Follows the task to its end and returns its answer. Raises :class:`TaskFailed`,
        :class:`Cancelled`, or :class:`WaitTimeout` when ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stream = self._client._hub.watch(self.id, 0)
        effects: dict[str, bool] = {}
        while not self.done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"task {self.id} did not end within {timeout}s")
            try:
                got = stream.next(left)
            except WaitTimeout as e:
                raise WaitTimeout(f"task {self.id} did not end within {timeout}s") from e
            if got is None:
                self.refresh()
                break
            self._event(got, effects)
        return self._outcome()

    def _outcome(self) -> str:
        if self.state == "cancelled":
            raise Cancelled(f"task {self.id} was cancelled: {self.error or ''}".rstrip(": "))
        if self.state != "succeeded":
            raise TaskFailed(f"task {self.id} {self.state}: {self.error or self.result or ''}")
        return self.result or ""

    def cancel(self, reason: str = "") -> Task:
        """Cancels the task."""
        self._snap = json.loads(self._client._hub.cancel(self.id, reason))
        return self

    def approvals(self) -> list[Approval]:
        """The task's pending approvals."""
        return [a for a in self._client.approvals() if a.task_id == self.id]

    def artifacts(self) -> list[Artifact]:
        """The artifacts the task's run saved."""
        return self._client.artifacts(self.id)

    def trace(self) -> Trace:
        """The task's trace."""
        return self._client.trace(self.id)


class Client:
    """A connection to an Agen Hub (lazy: the first call reports an unreachable Hub)."""

    def __init__(
        self,
        hub: str | None = None,
        *,
        token: str | None = None,
        ca_file: StrPath | None = None,
        namespace: str | None = None,
    ) -> None:
        self._hub = _native.Hub(
            _env(hub, "AGEN_HUB"),
            _env(token, "AGEN_TOKEN"),
            _env(ca_file, "AGEN_CA_FILE"),
            _env(namespace, "AGEN_NAMESPACE"),
        )

    @property
    def url(self) -> str:
        """The Hub URL in use."""
        return self._hub.url

    @property
    def namespace(self) -> str:
        """The namespace every call is made in."""
        return self._hub.namespace

    def deploy(
        self,
        bundle: StrPath,
        *,
        name: str | None = None,
        replicas: int | None = None,
        wait: bool = True,
        timeout: float = 120.0,
        webhook: str | None = None,
        webhook_secret: str | None = None,
        webhook_on_waiting: bool = False,
    ) -> Deployment:
        """Uploads bundle folder ``bundle`` and creates or rolls the deployment (``name``
        defaults to the bundle's name; ``replicas`` to what it has now, 1 for a new one).
        With ``wait``, returns once every replica runs it and is healthy. ``webhook``: a URL
        told of every task's end (and wait for an approval, with ``webhook_on_waiting``),
        signed with platform secret ``webhook_secret``; a deploy without it removes the
        deployment's webhook (as ``agen deploy`` does)."""
        return Deployment._of(json.loads(self._hub.deploy(
            Path(bundle), name, replicas, wait, timeout, webhook, webhook_secret, webhook_on_waiting
        )))

    def scale(self, name: str, replicas: int) -> Deployment:
        """Sets deployment ``name``'s replica count."""
        return Deployment._of(json.loads(self._hub.scale(name, replicas)))

    def deployment(self, name: str) -> Deployment:
        """Deployment ``name`` with its instances."""
        return Deployment._of(json.loads(self._hub.deployment(name)))

    def deployments(self) -> list[Deployment]:
        """The namespace's deployments."""
        return [Deployment._of(d) for d in json.loads(self._hub.deployments())]

    def submit(
        self,
        deployment: str,
        input: str,
        *,
        conversation_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        allow: Sequence[str] = (),
        ask: Sequence[str] = (),
        deny: Sequence[str] = (),
        client_request_id: str | None = None,
        traceparent: str | None = None,
        double_texting: DoubleTexting | None = None,
        webhook: str | Sequence[str] | None = None,
        webhook_on_waiting: bool = False,
    ) -> Task:
        """Queues a task. ``timeout`` (seconds) fails it when not finished in time;
        ``max_tokens`` caps its tokens; ``allow``/``ask``/``deny`` narrow the bundle's tool
        permissions for this task; a retry with the same ``client_request_id`` returns the
        same task instead of a second one.

        ``double_texting`` (with a ``conversation_key`` whose conversation has a task queued
        or running): ``reject`` raises :class:`TaskFailed` naming that task, ``enqueue`` runs
        after it, ``interrupt`` stops it at its next safe point, ``rollback`` cancels it and
        removes its turns; ``None``: the bundle's ``doubleTexting`` (default ``enqueue``).
        ``webhook``: URL(s) told by a signed POST when the task ends (and, with
        ``webhook_on_waiting``, when it waits for an approval); needs the namespace's
        ``AGEN_WEBHOOK_SECRET``."""
        hooks = [webhook] if isinstance(webhook, str) else list(webhook or ())
        req = {
            "deployment": deployment,
            "input": input,
            "conversation_key": conversation_key,
            "labels": dict(labels or {}),
            "timeout_ms": None if timeout is None else max(1, round(timeout * 1000)) if timeout > 0 else 0,
            "max_tokens": max_tokens,
            "allow": list(allow),
            "ask": list(ask),
            "deny": list(deny),
            "client_request_id": client_request_id,
            "traceparent": traceparent,
            "double_texting": double_texting,
            "webhooks": hooks,
            "webhook_on_waiting": webhook_on_waiting,
        }
        return Task(self, json.loads(self._hub.submit(json.dumps(req))))

    def task(self, task_id: str) -> Task:
        """Task ``task_id`` as it is now."""
        return Task(self, json.loads(self._hub.task(task_id)))

    def cancel(self, task_id: str, reason: str = "") -> Task:
        """Cancels task ``task_id``."""
        return Task(self, json.loads(self._hub.cancel(task_id, reason)))

    def approvals(self, deployment: str | None = None) -> list[Approval]:
        """Pending approvals of ``ask`` calls (of one deployment, or all)."""
        return [Approval._of(a) for a in json.loads(self._hub.approvals(deployment))]

    def approve(self, task_id: str, call_id: str | None = None, *, always: bool = False) -> Approval:
        """Approves a pending call of ``task_id`` (``call_id`` may be left out when there is one);
        ``always``: later calls of the same tool in this task too."""
        return Approval._of(json.loads(self._hub.decide(task_id, call_id or "", True, "", always)))

    def deny(self, task_id: str, call_id: str | None = None, *, reason: str = "") -> Approval:
        """Denies a pending call; the model is told ``reason``."""
        return Approval._of(json.loads(self._hub.decide(task_id, call_id or "", False, reason, False)))

    def artifacts(self, task_id: str | None = None) -> list[Artifact]:
        """Artifacts of ``task_id`` (or of the namespace)."""
        return [
            Artifact(
                id=str(a["id"]),
                name=str(a["name"]),
                media_type=str(a["media_type"]),
                size=int(a["size"]),
                task_id=str(a["task_id"]),
            )
            for a in json.loads(self._hub.artifacts(task_id))
        ]

    def download(self, artifact_id: str, path: StrPath) -> int:
        """Writes artifact ``artifact_id`` to file ``path``; returns its size in bytes."""
        return self._hub.download(artifact_id, Path(path))

    def task_webhooks(self, task_id: str) -> list[WebhookDelivery]:
        """Task ``task_id``'s webhook deliveries."""
        return [WebhookDelivery._of(d) for d in json.loads(self._hub.task_webhooks(task_id))]

    def create_schedule(
        self,
        deployment: str,
        *,
        cron: str,
        input: str,
        timezone: str = "UTC",
        conversation_key: str | None = None,
        overlap: Literal["skip", "enqueue", "allow"] = "skip",
        catch_up: Literal["latest", "none"] = "latest",
    ) -> Schedule:
        """Creates a schedule: ``deployment`` gets a task with ``input`` at every slot of
        ``cron`` (5 fields, or 6 with seconds first) in IANA zone ``timezone``. ``overlap``: a
        slot while the last firing's task runs is skipped, enqueued or allowed; ``catch_up``:
        slots missed while no Hub ran fire one task (``latest``) or none. A bad expression or
        zone raises :class:`InvalidArgument` naming the field."""
        req = {
            "deployment": deployment,
            "cron": cron,
            "timezone": timezone,
            "input": input,
            "conversation_key": conversation_key,
            "overlap": overlap,
            "catch_up": catch_up,
        }
        return Schedule._of(json.loads(self._hub.create_schedule(json.dumps(req))))

    def schedules(self) -> list[Schedule]:
        """The namespace's schedules."""
        return [Schedule._of(s) for s in json.loads(self._hub.schedules())]

    def pause_schedule(self, schedule_id: str) -> Schedule:
        """Pauses a schedule: it fires nothing until resumed."""
        return Schedule._of(json.loads(self._hub.change_schedule(schedule_id, "pause")))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Resumes a paused schedule from its next slot (slots skipped meanwhile do not fire)."""
        return Schedule._of(json.loads(self._hub.change_schedule(schedule_id, "resume")))

    def delete_schedule(self, schedule_id: str) -> Schedule:
        """Removes a schedule (its tasks stay); returns it as it was."""
        return Schedule._of(json.loads(self._hub.change_schedule(schedule_id, "delete")))

    def run_schedule(self, schedule_id: str) -> Task:
        """Submits the schedule's task now (labelled with slot ``manual``)."""
        return Task(self, json.loads(self._hub.run_schedule(schedule_id)))

    def trace(self, task_id: str) -> Trace:
        """Task ``task_id``'s trace: its spans with durations and status."""
        t = json.loads(self._hub.trace(task_id))
        return Trace(
            task_id=str(t["task_id"]),
            trace_id=str(t["trace_id"]),
            spans=[
                Span(
                    span_id=str(s["span_id"]),
                    parent_span_id=str(s["parent_span_id"]),
                    name=str(s["name"]),
                    start_ms=int(s["start_ms"]),
                    end_ms=int(s["end_ms"]),
                    status=str(s["status"]),
                    attributes={str(k): str(v) for k, v in s["attributes"].items()},
                )
                for s in t["spans"]
            ],
        )


class AsyncTask:
    """:class:`Task` for ``asyncio``."""

    def __init__(self, task: Task) -> None:
        self.sync = task

    def __repr__(self) -> str:
        return repr(self.sync).replace("Task(", "AsyncTask(", 1)

    @property
    def id(self) -> str:
        """The task id."""
        return self.sync.id

    @property
    def state(self) -> str:
        """The state of the last snapshot."""
        return self.sync.state

    @property
    def result(self) -> str | None:
        """The answer once the task ended, else ``None``."""
        return self.sync.result

    @property
    def error(self) -> str | None:
        """Why the task failed or was cancelled, once it did."""
        return self.sync.error

    async def refresh(self) -> AsyncTask:
        """Fetches the task again."""
        await asyncio.to_thread(self.sync.refresh)
        return self

    async def wait(self, timeout: float | None = None) -> str:
        """Follows the task to its end and returns its answer (see :meth:`Task.wait`)."""
        return await asyncio.to_thread(self.sync.wait, timeout)

    async def events(self, from_seq: int = 0, *, deltas: bool = False) -> AsyncIterator[Event]:
        """``async for event in task.events()``: as :meth:`Task.events`."""
        stream = self.sync._client._hub.watch(self.sync.id, from_seq, deltas)
        effects: dict[str, bool] = {}
        while True:
            got = await asyncio.to_thread(stream.next)
            if got is None:
                return
            yield self.sync._event(got, effects)

    async def stream(self) -> AsyncIterator[TextDelta | TextReset]:
        """``async for piece in task.stream()``: as :meth:`Task.stream`."""
        async for event in self.events(deltas=True):
            if isinstance(event, (TextDelta, TextReset)):
                yield event

    async def webhooks(self) -> list[WebhookDelivery]:
        """The task's webhook deliveries."""
        return await asyncio.to_thread(self.sync.webhooks)

    async def cancel(self, reason: str = "") -> AsyncTask:
        """Cancels the task."""
        await asyncio.to_thread(self.sync.cancel, reason)
        return self

    async def approvals(self) -> list[Approval]:
        """The task's pending approvals."""
        return await asyncio.to_thread(self.sync.approvals)

    async def artifacts(self) -> list[Artifact]:
        """The artifacts the task's run saved."""
        return await asyncio.to_thread(self.sync.artifacts)

    async def trace(self) -> Trace:
        """The task's trace."""
        return await asyncio.to_thread(self.sync.trace)


class AsyncClient:
    """:class:`Client` for ``asyncio``: the same calls, awaitable."""

    def __init__(
        self,
        hub: str | None = None,
        *,
        token: str | None = None,
        ca_file: StrPath | None = None,
        namespace: str | None = None,
    ) -> None:
        self.sync = Client(hub, token=token, ca_file=ca_file, namespace=namespace)

    async def deploy(
        self,
        bundle: StrPath,
        *,
        name: str | None = None,
        replicas: int | None = None,
        wait: bool = True,
        timeout: float = 120.0,
        webhook: str | None = None,
        webhook_secret: str | None = None,
        webhook_on_waiting: bool = False,
    ) -> Deployment:
        """See :meth:`Client.deploy`."""
        return await asyncio.to_thread(
            lambda: self.sync.deploy(
                bundle,
                name=name,
                replicas=replicas,
                wait=wait,
                timeout=timeout,
                webhook=webhook,
                webhook_secret=webhook_secret,
                webhook_on_waiting=webhook_on_waiting,
            )
        )

    async def scale(self, name: str, replicas: int) -> Deployment:
        """See :meth:`Client.scale`."""
        return await asyncio.to_thread(self.sync.scale, name, replicas)

    async def deployments(self) -> list[Deployment]:
        """See :meth:`Client.deployments`."""
        return await asyncio.to_thread(self.sync.deployments)

    async def deployment(self, name: str) -> Deployment:
        """See :meth:`Client.deployment`."""
        return await asyncio.to_thread(self.sync.deployment, name)

    async def submit(
        self,
        deployment: str,
        input: str,
        *,
        conversation_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        allow: Sequence[str] = (),
        ask: Sequence[str] = (),
        deny: Sequence[str] = (),
        client_request_id: str | None = None,
        double_texting: DoubleTexting | None = None,
        webhook: str | Sequence[str] | None = None,
        webhook_on_waiting: bool = False,
    ) -> AsyncTask:
        """See :meth:`Client.submit`."""
        t = await asyncio.to_thread(
            lambda: self.sync.submit(
                deployment,
                input,
                conversation_key=conversation_key,
                labels=labels,
                timeout=timeout,
                max_tokens=max_tokens,
                allow=allow,
                ask=ask,
                deny=deny,
                client_request_id=client_request_id,
                double_texting=double_texting,
                webhook=webhook,
                webhook_on_waiting=webhook_on_waiting,
            )
        )
        return AsyncTask(t)

    async def task(self, task_id: str) -> AsyncTask:
        """See :meth:`Client.task`."""
        return AsyncTask(await asyncio.to_thread(self.sync.task, task_id))

    async def cancel(self, task_id: str, reason: str = "") -> AsyncTask:
        """See :meth:`Client.cancel`."""
        return AsyncTask(await asyncio.to_thread(self.sync.cancel, task_id, reason))

    async def approvals(self, deployment: str | None = None) -> list[Approval]:
        """See :meth:`Client.approvals`."""
        return await asyncio.to_thread(self.sync.approvals, deployment)

    async def approve(self, task_id: str, call_id: str | None = None, *, always: bool = False) -> Approval:
        """See :meth:`Client.approve`."""
        return await asyncio.to_thread(self.sync.approve, task_id, call_id, always=always)

    async def deny(self, task_id: str, call_id: str | None = None, *, reason: str = "") -> Approval:
        """See :meth:`Client.deny`."""
        return await asyncio.to_thread(self.sync.deny, task_id, call_id, reason=reason)

    async def artifacts(self, task_id: str | None = None) -> list[Artifact]:
        """See :meth:`Client.artifacts`."""
        return await asyncio.to_thread(self.sync.artifacts, task_id)

    async def download(self, artifact_id: str, path: StrPath) -> int:
        """See :meth:`Client.download`."""
        return await asyncio.to_thread(self.sync.download, artifact_id, path)

    async def trace(self, task_id: str) -> Trace:
        """See :meth:`Client.trace`."""
        return await asyncio.to_thread(self.sync.trace, task_id)

    async def task_webhooks(self, task_id: str) -> list[WebhookDelivery]:
        """See :meth:`Client.task_webhooks`."""
        return await asyncio.to_thread(self.sync.task_webhooks, task_id)

    async def create_schedule(
        self,
        deployment: str,
        *,
        cron: str,
        input: str,
        timezone: str = "UTC",
        conversation_key: str | None = None,
        overlap: Literal["skip", "enqueue", "allow"] = "skip",
        catch_up: Literal["latest", "none"] = "latest",
    ) -> Schedule:
        """See :meth:`Client.create_schedule`."""
        return await asyncio.to_thread(
            lambda: self.sync.create_schedule(
                deployment,
                cron=cron,
                input=input,
                timezone=timezone,
                conversation_key=conversation_key,
                overlap=overlap,
                catch_up=catch_up,
            )
        )

    async def schedules(self) -> list[Schedule]:
        """See :meth:`Client.schedules`."""
        return await asyncio.to_thread(self.sync.schedules)

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        """See :meth:`Client.pause_schedule`."""
        return await asyncio.to_thread(self.sync.pause_schedule, schedule_id)

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        """See :meth:`Client.resume_schedule`."""
        return await asyncio.to_thread(self.sync.resume_schedule, schedule_id)

    async def delete_schedule(self, schedule_id: str) -> Schedule:
        """See :meth:`Client.delete_schedule`."""
        return await asyncio.to_thread(self.sync.delete_schedule, schedule_id)

    async def run_schedule(self, schedule_id: str) -> AsyncTask:
        """See :meth:`Client.run_schedule`."""
        return AsyncTask(await asyncio.to_thread(self.sync.run_schedule, schedule_id))
