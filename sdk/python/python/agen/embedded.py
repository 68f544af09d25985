"""An Agen agent inside this Python process, with tools written in Python.

The agent loop is the Rust harness ``agen run`` and fleet instances use (in-process, through
the native module): the same tool gate, effect ledger, permissions and resume rules. A tool is
a Python function (sync or ``async``) decorated with :func:`tool`; its JSON schema comes from
its type hints (pydantic models where given).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import json
import os
import shutil
import threading
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, overload

from . import _native
from .events import Event, parse

P = ParamSpec("P")
R = TypeVar("R")
StrPath = str | os.PathLike[str]


@dataclass(frozen=True)
class ToolContext:
    """What a tool call knows of its run; declare a parameter of this type to receive it.
    ``call_id`` is stable across resumes of the same call: an idempotency key for your side
    effects is ``f"{ctx.run_id}/{ctx.call_id}"``."""

    call_id: str
    run_id: str
    task_id: str
    meta: dict[str, Any]


@dataclass(frozen=True)
class ApprovalRequest:
    """An ``ask`` call waiting for the ``on_ask`` callback."""

    run_id: str
    call_id: str
    tool: str
    arguments: Any


class Tool(Generic[P, R]):
    """A Python function the model can call (made by :func:`tool`). Calling the object calls
    the function."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None,
        description: str | None,
        read_only: bool,
        idempotent: bool,
        destructive: bool,
    ) -> None:
        if read_only and destructive:
            raise ValueError(f"tool {fn.__name__}: read_only and destructive contradict each other")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description or _summary(inspect.getdoc(fn) or "")
        self.read_only = read_only
        self.idempotent = idempotent
        self.destructive = destructive
        self.input_schema, self._params = _schema_of(fn)
        self._context_param = next(
            (n for n, p in inspect.signature(fn).parameters.items() if _hints(fn).get(n) is ToolContext),
            None,
        )
        self.is_async = inspect.iscoroutinefunction(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Calls the function itself (no agent involved)."""
        return self.fn(*args, **kwargs)

    def spec(self) -> dict[str, Any]:
        """The tool as the model and the effect ledger see it. ``read_only`` never counts as a
        side effect; ``idempotent`` may be called again after a crash; neither (``destructive``
        included) is side-effecting: completed calls are never repeated, an interrupted one is
        reported to the model as ``effect_unknown``."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "read_only": self.read_only,
            "idempotent": self.idempotent and not self.read_only,
        }

    def _invoke(self, arguments: str, context: str, loop: asyncio.AbstractEventLoop | None) -> tuple[bool, str]:
        """Runs one call for the harness: ``(True, text)``, or ``(False, error)`` when the
        function raised (the model sees an error result naming the exception)."""
        try:
            args = json.loads(arguments) if arguments else {}
            kwargs = {n: _convert(args[n], t) for n, t in self._params.items() if n in args}
            if self._context_param is not None:
                c = json.loads(context)
                kwargs[self._context_param] = ToolContext(
                    call_id=str(c.get("call_id", "")),
                    run_id=str(c.get("run_id", "")),
                    task_id=str(c.get("task_id", "")),
                    meta=c.get("meta") or {},
                )
            out: Any = self.fn(**kwargs)  # type: ignore[call-arg]
            if inspect.isawaitable(out):
                out = _await(out, loop)
            return True, _text(out)
        except Exception as e:  # a tool's failure is the model's to handle
            return False, f"{type(e).__name__}: {e}"


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    destructive: bool = False,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Makes a function a tool: ``@tool`` or ``@tool(read_only=True)``. The name is the
    function's, the description its docstring's first paragraph, the arguments' JSON schema
    comes from its type hints. The hints map to the MCP annotations and so to the effect
    ledger: ``read_only`` (readOnlyHint), ``idempotent`` (idempotentHint), ``destructive``
    (destructiveHint: side-effecting, as is a tool with no hint)."""

    def make(f: Callable[P, R]) -> Tool[P, R]:
        return Tool(
            f,
            name=name,
            description=description,
            read_only=read_only,
            idempotent=idempotent,
            destructive=destructive,
        )

    return make(fn) if fn is not None else make


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``state`` (``succeeded``, ``failed``, ``cancelled``) and ``text``, the
    answer or what went wrong."""

    run_id: str
    state: str
    text: str
    response_type: str
    input_tokens: int
    output_tokens: int
    artifacts: list[dict[str, Any]]

    @property
    def succeeded(self) -> bool:
        """Whether the run succeeded."""
        return self.state == "succeeded"


def _result(outcome: str) -> RunResult:
    o = json.loads(outcome)
    usage = o.get("usage") or {}
    return RunResult(
        run_id=str(o["run_id"]),
        state=str(o["state"]),
        text=str(o["result"]),
        response_type=str(o.get("response_type") or "text"),
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        artifacts=list(o.get("artifacts") or []),
    )


class RunStream:
    """A run in progress: iterate it for its events (the last is ``run.finished``), then
    :meth:`outcome`; under ``asyncio``, ``async for`` and :meth:`aoutcome` (``async`` tools then
    run on that event loop). Leaving a ``with`` block before the end cancels the run."""

    def __init__(self, run: _native.Run, agent: Agent | None = None) -> None:
        self._run = run
        self._agent = agent
        self._effects: dict[str, bool] = {}

    @property
    def run_id(self) -> str:
        """The run's id (its folder in the run log)."""
        return self._run.run_id

    def __iter__(self) -> Iterator[Event]:
        while (got := self._run.next()) is not None:
            v = json.loads(got)
            yield parse(str(v["kind"]), v.get("json"), effects=self._effects)

    def outcome(self) -> RunResult:
        """Waits for the run's end (events not read are skipped)."""
        return _result(self._run.outcome())

    async def __aiter__(self) -> AsyncIterator[Event]:
        if self._agent is not None:
            self._agent._loop = asyncio.get_running_loop()
        while (got := await asyncio.to_thread(self._run.next)) is not None:
            v = json.loads(got)
            yield parse(str(v["kind"]), v.get("json"), effects=self._effects)

    async def aoutcome(self) -> RunResult:
        """:meth:`outcome` for ``asyncio``."""
        return _result(await asyncio.to_thread(self._run.outcome))

    def cancel(self) -> None:
        """Cancels the run: the tool call in flight is stopped, the run ends ``cancelled``."""
        self._run.cancel()

    def __enter__(self) -> RunStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._run.cancel()


class Agent:
    """An agent in this process. ``Agent(model=..., system=..., tools=[...])`` builds one in
    code; ``Agent.from_bundle(path)`` loads a bundle folder (its MCP servers start beside the
    Python tools). Both are validated as ``agen deploy`` validates a bundle.

    ``run_log``: a folder where every run keeps its log, so that after a crash
    :meth:`unfinished_runs` and :meth:`resume` finish them without repeating a completed
    side-effecting tool call. ``on_ask``: called for each call of a tool matched by ``ask``
    (or the bundle's ``ask`` permissions); it returns ``True`` to approve, ``False`` or
    ``(False, reason)`` to deny.

    The API key comes from ``OPENAI_API_KEY`` (``ANTHROPIC_API_KEY`` for ``anthropic/…``)
    unless ``api_key`` is given; a code-built ``openai/…`` agent takes ``OPENAI_BASE_URL`` when
    ``base_url`` is not given. ``"command": "agen"`` MCP servers run ``agen_bin`` (default:
    ``$AGEN_BIN``, else ``agen`` on ``PATH``)."""

    def __init__(
        self,
        model: str | None = None,
        system: str | None = None,
        tools: Sequence[Tool[Any, Any]] = (),
        *,
        name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        run_log: StrPath | None = None,
        artifacts_dir: StrPath | None = None,
        allow: Sequence[str] = (),
        ask: Sequence[str] = (),
        deny: Sequence[str] = (),
        on_ask: Callable[[ApprovalRequest], bool | tuple[bool, str]] | None = None,
        max_turns: int | None = None,
        tool_timeout: float | None = None,
        mcp_servers: Mapping[str, Mapping[str, Any]] | None = None,
        agen_bin: StrPath | None = None,
        bundle: StrPath | None = None,
    ) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        binary = agen_bin or os.environ.get("AGEN_BIN") or shutil.which("agen")
        if base_url is None and bundle is None and (model or "").startswith("openai/"):
            base_url = os.environ.get("OPENAI_BASE_URL") or None
        spec = {
            "bundle": None if bundle is None else str(bundle),
            "name": name,
            "model": model,
            "system": system,
            "base_url": base_url,
            "api_key": api_key,
            "run_log": None if run_log is None else str(run_log),
            "artifacts_dir": None if artifacts_dir is None else str(artifacts_dir),
            "allow": list(allow),
            "ask": list(ask),
            "deny": list(deny),
            "max_turns": max_turns,
            "tool_timeout_s": tool_timeout,
            "mcp_servers": {k: dict(v) for k, v in (mcp_servers or {}).items()},
            "agen_bin": None if binary is None else str(binary),
        }
        self.tools = list(tools)
        native_tools = [(json.dumps(t.spec()), self._caller(t)) for t in self.tools]
        self._agent = _native.Agent(json.dumps(spec), native_tools, None if on_ask is None else _approver(on_ask))

    @classmethod
    def from_bundle(cls, path: StrPath, *, tools: Sequence[Tool[Any, Any]] = (), **options: Any) -> Agent:
        """The agent of bundle folder ``path`` (``x-agen/agent.md``, ``mcp.json``, skills),
        with ``tools`` beside its MCP servers; ``options`` as for :class:`Agent` (``model``
        and ``system`` come from the bundle)."""
        return cls(tools=tools, bundle=path, **options)

    def _caller(self, t: Tool[Any, Any]) -> Callable[[str, str], tuple[bool, str]]:
        return lambda arguments, context: t._invoke(arguments, context, self._loop)

    @property
    def name(self) -> str:
        """The agent's name."""
        return self._agent.name

    def tool_names(self) -> list[str]:
        """The tools the model is offered (Python tools, bundle MCP tools, built-ins)."""
        return self._agent.tool_names()

    def run(
        self,
        input: str,
        *,
        run_id: str | None = None,
        conversation: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Runs ``input`` to its end. ``conversation`` continues that conversation's history;
        ``run_id`` names the run (its run-log folder)."""
        return self.stream(input, run_id=run_id, conversation=conversation, labels=labels).outcome()

    def stream(
        self,
        input: str,
        *,
        run_id: str | None = None,
        conversation: str | None = None,
        labels: Mapping[str, str] | None = None,
        deltas: bool = False,
    ) -> RunStream:
        """Starts ``input``; iterate the result for its typed events, then ``.outcome()``.
        With ``deltas``, the model's answer as it is written comes between the events
        (:class:`~agen.events.TextDelta`; a :class:`~agen.events.TextReset` when the provider
        retried a turn: drop what was shown of it). The pieces are never in the run log."""
        return RunStream(self._agent.start(input, run_id, conversation, dict(labels or {}), deltas), self)

    async def arun(
        self,
        input: str,
        *,
        run_id: str | None = None,
        conversation: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RunResult:
        """:meth:`run` for ``asyncio``: ``async`` tools run on the calling event loop."""
        self._loop = asyncio.get_running_loop()
        return await asyncio.to_thread(self.run, input, run_id=run_id, conversation=conversation, labels=labels)

    def resume(self, run_id: str) -> RunResult:
        """Finishes run ``run_id`` of the run log after a crash: answered model turns are not
        asked again, recorded tool results are reused, a completed side-effecting call is never
        made again (an interrupted one is reported to the model as ``effect_unknown``)."""
        return RunStream(self._agent.resume(run_id)).outcome()

    def unfinished_runs(self) -> list[str]:
        """The run log's runs that did not finish (a crash interrupted them)."""
        return self._agent.unfinished_runs()

    def read_artifact(self, artifact_id: str) -> bytes:
        """The bytes of an artifact a run saved."""
        return self._agent.read_artifact(artifact_id)

    def close(self) -> None:
        """Stops the agent's MCP servers."""
        self._agent.shutdown()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _approver(on_ask: Callable[[ApprovalRequest], bool | tuple[bool, str]]) -> Callable[[str], tuple[bool, str]]:
    def decide(request: str) -> tuple[bool, str]:
        r = json.loads(request)
        try:
            got = on_ask(
                ApprovalRequest(
                    run_id=str(r["run_id"]), call_id=str(r["call_id"]), tool=str(r["tool"]), arguments=r["arguments"]
                )
            )
        except Exception as e:
            return False, f"the approval callback raised {type(e).__name__}: {e}"
        if isinstance(got, tuple):
            return bool(got[0]), str(got[1])
        return bool(got), "" if got else "denied by the on_ask callback"

    return decide


def _await(aw: Awaitable[Any], loop: asyncio.AbstractEventLoop | None) -> Any:
    """Runs an async tool's awaitable: on the loop of ``Agent.arun`` when there is one running
    (its tools share it), else on a fresh loop of this worker thread."""

    async def wrap() -> Any:
        return await aw

    if loop is not None and loop.is_running():
        return asyncio.run_coroutine_threadsafe(wrap(), loop).result()
    return asyncio.run(wrap())


def _text(out: Any) -> str:
    if isinstance(out, str):
        return out
    dump = getattr(out, "model_dump_json", None)
    if callable(dump):
        return str(dump())
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return json.dumps(dataclasses.asdict(out))
    return json.dumps(out)


def _summary(doc: str) -> str:
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and callable(getattr(t, "model_json_schema", None)) and callable(
        getattr(t, "model_validate", None)
    )


def _convert(value: Any, t: Any) -> Any:
    """The argument as the function wants it: a pydantic model validated, the rest as JSON gave it."""
    if _is_model(t):
        return t.model_validate(value)
    return value


def _schema_of(fn: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON schema of ``fn``'s arguments and each argument's type hint."""
    hints = _hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    params: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    for n, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        t = hints.get(n, Any)
        if t is ToolContext:
            continue
        params[n] = t
        props[n] = _schema(t, defs)
        if p.default is inspect.Parameter.empty and not _optional(t):
            required.append(n)
        elif p.default is not inspect.Parameter.empty and _jsonable(p.default):
            props[n]["default"] = p.default
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if defs:
        schema["$defs"] = defs
    return schema, params


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _optional(t: Any) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in typing.get_args(t)


def _schema(t: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of type hint ``t`` (pydantic models' ``$defs`` hoisted into ``defs``)."""
    if _is_model(t):
        s: dict[str, Any] = dict(t.model_json_schema(ref_template="#/$defs/{model}"))
        defs.update(s.pop("$defs", {}))
        return s
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is str:
        return {"type": "string"}
    if t is bool:
        return {"type": "boolean"}
    if t is int:
        return {"type": "integer"}
    if t is float:
        return {"type": "number"}
    if t is type(None):
        return {"type": "null"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return {"enum": [m.value for m in t]}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in args]}
    if t in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, Sequence):
        return {"type": "array", "items": _schema(args[0], defs)} if args else {"type": "array"}
    if t is dict or origin in (dict, Mapping):
        if len(args) == 2:
            return {"type": "object", "additionalProperties": _schema(args[1], defs)}
        return {"type": "object"}
    return {}
