"""The embedded agent: the Rust harness in this process with Python tools (sync and async),
schemas from type hints and pydantic, tool exceptions as tool errors, streamed events, `ask`
decided by a Python callback, a bundle's MCP servers beside Python tools, and the answer as it
streams (``deltas=True``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pydantic
from conftest import AGEN_BIN, write_bundle

import agen
from agen import Agent, ToolContext, events, tool


class Order(pydantic.BaseModel):
    """An order to look up."""

    id: str
    priority: Literal["low", "high"] = "low"


@tool(read_only=True)
def weather(city: str, days: int = 1) -> str:
    """Today's weather in a city."""
    return f"{city}: sunny for {days} day(s)"


@tool(read_only=True)
async def forecast(city: str) -> str:
    """Tomorrow's weather, from a slow service."""
    await asyncio.sleep(0.05)
    return f"{city}: rain tomorrow"


@tool(idempotent=True)
def order_status(order: Order, ctx: ToolContext) -> dict[str, Any]:
    """The shipping status of an order."""
    return {"id": order.id, "priority": order.priority, "status": "shipped", "call": ctx.call_id}


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot do that: {reason}")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def test_sync_and_async_tools_with_streamed_events(fake_model: Any) -> None:
    model = fake_model([
        call("weather", city="Oslo"),
        call("forecast", city="Bergen"),
        {"reply_template": "{{last_tool_result}}"},
    ])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", system="Be brief.",
                  tools=[weather, forecast])
    with agent.stream("Weather?") as run:
        seen = list(run)
        result = run.outcome()
    assert result.succeeded and result.text == "Bergen: rain tomorrow", result
    done = [(e.tool, e.result, e.side_effect) for e in seen if isinstance(e, events.ToolCompleted)]
    assert done == [("weather", "Oslo: sunny for 1 day(s)", False), ("forecast", "Bergen: rain tomorrow", False)]
    assert isinstance(seen[-1], events.Finished) and seen[-1].state == "succeeded"
    assert any(isinstance(e, events.ModelRequested) for e in seen)


def test_schema_from_type_hints_and_pydantic(fake_model: Any) -> None:
    model = fake_model([
        call("order_status", order={"id": "A-1001", "priority": "high"}),
        {"reply_template": "{{last_tool_result}}"},
    ])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[weather, order_status])
    result = agent.run("Where is A-1001?", run_id="run-1")
    got = json.loads(result.text)
    assert (got["id"], got["priority"], got["status"]) == ("A-1001", "high", "shipped"), got
    tools = {t["function"]["name"]: t["function"] for t in model.requests()[0]["body"]["tools"]}
    assert tools["weather"]["parameters"]["properties"] == {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}}
    assert tools["weather"]["parameters"]["required"] == ["city"]
    order = tools["order_status"]["parameters"]
    assert order["required"] == ["order"] and "ctx" not in order["properties"]
    assert order["properties"]["order"]["properties"]["priority"]["enum"] == ["low", "high"]
    assert tools["order_status"]["description"] == "The shipping status of an order."


def test_a_tool_exception_is_a_tool_error_the_model_sees(fake_model: Any) -> None:
    model = fake_model([call("explode", reason="Sunday"), {"reply_template": "saw: {{last_tool_result}}"}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[explode])
    with agent.stream("go") as run:
        seen = list(run)
        result = run.outcome()
    assert result.text == "saw: ValueError: cannot do that: Sunday", result
    errs = [e for e in seen if isinstance(e, (events.ToolCompleted, events.ToolFailed))]
    assert len(errs) == 1, errs


def test_ask_calls_the_python_callback(fake_model: Any, tmp_path: Path) -> None:
    charged: list[int] = []

    @tool
    def charge(cents: int) -> str:
        """Charges the card."""
        charged.append(cents)
        return f"charged {cents}"

    asked: list[agen.ApprovalRequest] = []

    def decide(req: agen.ApprovalRequest) -> bool | tuple[bool, str]:
        asked.append(req)
        return (False, "over the limit") if req.arguments["cents"] > 1000 else True

    model = fake_model([call("charge", cents=5000), call("charge", cents=500), {"reply_template": "{{last_tool_result}}"}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[charge], ask=["charge"], on_ask=decide)
    result = agent.run("pay")
    assert result.text == "charged 500"
    assert charged == [500]
    assert [r.arguments["cents"] for r in asked] == [5000, 500] and asked[0].tool == "charge"
    sent = model.requests()[2]["body"]["messages"]
    assert any("over the limit" in str(m.get("content")) for m in sent), sent


def test_arun_runs_async_tools_on_the_callers_loop(fake_model: Any) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    @tool(read_only=True)
    async def where() -> str:
        """Which loop runs me."""
        loops.append(asyncio.get_running_loop())
        return "here"

    model = fake_model([call("where"), {"reply_template": "{{last_tool_result}}"}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[where])

    async def main() -> tuple[str, asyncio.AbstractEventLoop]:
        r = await agent.arun("where?")
        return r.text, asyncio.get_running_loop()

    text, loop = asyncio.run(main())
    assert text == "here" and loops == [loop]


def test_bundle_mcp_servers_beside_python_tools(fake_model: Any, tmp_path: Path) -> None:
    model = fake_model([
        call("ws_write", path="note.txt", content="from the bundle's server"),
        call("weather", city="Oslo"),
        call("ws_read", path="note.txt"),
        {"reply_template": "{{last_tool_result}}"},
    ])
    bundle = write_bundle(tmp_path / "bundle", "helper", model.base_url)
    with Agent.from_bundle(bundle, tools=[weather], api_key="test", agen_bin=AGEN_BIN) as agent:
        names = agent.tool_names()
        assert "weather" in names and "ws_read" in names, names
        result = agent.run("note")
    assert "from the bundle's server" in result.text, result
    assert agent.name == "helper"


def test_a_bad_definition_is_invalid_argument(tmp_path: Path) -> None:
    try:
        Agent(model="gpt-4", api_key="x")
    except agen.InvalidArgument as e:
        assert "model" in str(e)
    else:
        raise AssertionError("a model without a provider was accepted")


def test_cancel_ends_the_run_while_a_tool_call_is_in_flight(fake_model: Any) -> None:
    started = threading.Event()

    @tool(read_only=True)
    def slow() -> str:
        """Takes its time."""
        started.set()
        time.sleep(5)
        return "late"

    model = fake_model([call("slow"), {"reply": "never"}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[slow])
    run = agent.stream("go")

    def cancel_once_started() -> None:
        if started.wait(20):
            run.cancel()

    threading.Thread(target=cancel_once_started, daemon=True).start()
    t0 = time.monotonic()
    seen = list(run)  # cancel() does not wait for this iteration's lock
    result = run.outcome()
    assert result.state == "cancelled", result
    assert time.monotonic() - t0 < 4.5, "the run waited for the tool instead of being cancelled"
    assert not any(isinstance(e, events.ToolCompleted) for e in seen)


def test_async_for_streams_events_with_async_tools_on_the_loop(fake_model: Any) -> None:
    model = fake_model([call("forecast", city="Tromsø"), {"reply_template": "{{last_tool_result}}"}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test", tools=[forecast])

    async def main() -> tuple[list[str], str]:
        run = agent.stream("tomorrow?")
        kinds = [e.kind async for e in run]
        return kinds, (await run.aoutcome()).text

    kinds, text = asyncio.run(main())
    assert text == "Tromsø: rain tomorrow"
    assert kinds[-1] == "run.finished" and "tool.completed" in kinds, kinds


def test_stream_with_deltas_yields_the_answer_as_it_is_written(fake_model: Any) -> None:
    answer = "".join(f"piece{i} " for i in range(12))
    model = fake_model([{"reply": answer, "chunk_chars": 5}])
    agent = Agent(model="openai/fake", base_url=model.base_url, api_key="test")
    with agent.stream("Speak", deltas=True) as run:
        seen = list(run)
        result = run.outcome()
    pieces = [e for e in seen if isinstance(e, events.TextDelta)]
    assert len(pieces) >= 3 and "".join(p.text for p in pieces) == answer == result.text, seen
    assert all((p.attempt, p.turn) == (1, 1) for p in pieces), pieces
    # Every piece of the turn came before its `model.answered`.
    answered = next(i for i, e in enumerate(seen) if isinstance(e, events.ModelAnswered))
    assert max(i for i, e in enumerate(seen) if isinstance(e, events.TextDelta)) < answered
    # Without `deltas`, events only.
    with agent.stream("Speak") as run:
        assert not any(isinstance(e, (events.TextDelta, events.TextReset)) for e in run)
