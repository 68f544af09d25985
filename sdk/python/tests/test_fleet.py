"""The fleet client against a real Hub and Nest (``agen up``) with the scripted fake model:
deploy, scale, list, submit, typed events (also across a dropped stream), approvals, artifacts,
trace, cancel, and the exception class of each failure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CuttingProxy, Fleet, wait_for, write_bundle

import agen
from agen import events
from agen.testing import FakeModel

# Every task of the "asker" deployment: saves an artifact, asks to run a shell command (ws.run
# is in `ask`), then answers with what the command's call returned.
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "report.txt", "content": "hello from the agent"}}]},
    {"tool_calls": [{"name": "ws_run", "arguments": {"command": "echo ran >> MARKER && echo ran"}}]},
    {"reply_template": "done: {{last_tool_result}}"},
]


@pytest.fixture(scope="module")
def asker(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("asker")
    marker = tmp / "marker"
    script = [dict(s) for s in SCRIPT]
    script[1] = {"tool_calls": [{"name": "ws_run", "arguments": {"command": f"echo ran >> {marker} && echo ran"}}]}
    with FakeModel(script, agen_bin=str(fleet.env()["AGEN_BIN"])) as model:
        bundle = write_bundle(tmp / "bundle", "asker", model.base_url, ask=["ws.run"])
        d = fleet.client().deploy(bundle, name="asker", wait=True)
        assert d.name == "asker" and d.ready_replicas == 1, d
        yield "asker", marker


# What `ws_run` answers for the command above, as the model quotes it.
DONE = "done: exit code: 0\noutput:\nran\n"


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_deploy_scale_list(fleet: Fleet, asker: tuple[str, Path], tmp_path: Path) -> None:
    client = fleet.client()
    unpinned = write_bundle(tmp_path / "unpinned", "unpinned", "http://127.0.0.1:9/v1", workspace=False)
    (unpinned / "mcp.json").write_text('{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "some-mcp-server"]}}}')
    d = client.deploy(unpinned, replicas=0, wait=False)
    assert (d.name, d.replicas) == ("unpinned", 0)
    assert len(d.warnings) == 1 and "some-mcp-server" in d.warnings[0], d.warnings
    names = [d.name for d in client.deployments()]
    assert "asker" in names
    d = client.scale("asker", 1)
    assert (d.name, d.replicas) == ("asker", 1)
    assert [i["state"] for i in client.deployment("asker").instances] == ["running"]


def test_submit_stream_approve_artifacts_trace(fleet: Fleet, asker: tuple[str, Path]) -> None:
    client = fleet.client()
    before = runs(asker[1])
    task = client.submit("asker", "go", labels={"customer": "42"}, conversation_key="c-1")
    assert task.deployment == "asker" and task.raw["labels"] == {"customer": "42"}
    seen: list[events.Event] = []
    for ev in task.events():
        seen.append(ev)
        if isinstance(ev, events.ApprovalWaiting):
            assert ev.tool == "ws.run" or ev.tool.endswith("run"), ev
            pending = client.approvals("asker")
            assert [(a.task_id, a.call_id) for a in pending] == [(task.id, ev.call_id)]
            decided = client.approve(task.id, ev.call_id)
            assert decided.approved is True
    kinds = [type(e).__name__ for e in seen]
    for want in ("ModelRequested", "ModelAnswered", "ToolStarted", "ToolCompleted", "ApprovalWaiting", "TaskState"):
        assert want in kinds, kinds
    seqs = [e.seq for e in seen]
    assert seqs == sorted(set(s for s in seqs if s is not None)), seqs
    last = seen[-1]
    assert isinstance(last, events.TaskState) and last.state == "succeeded", last
    ran = [e for e in seen if isinstance(e, events.ToolCompleted) and e.tool.endswith("run")]
    assert len(ran) == 1 and ran[0].side_effect is True, ran
    assert task.wait(timeout=30) == DONE
    assert task.result == DONE
    assert runs(asker[1]) == before + 1

    arts = task.artifacts()
    assert [a.name for a in arts] == ["report.txt"], arts
    out = fleet.dir / f"report-{task.id}.txt"
    assert client.download(arts[0].id, out) == len("hello from the agent")
    assert out.read_text() == "hello from the agent"
    trace = task.trace()
    assert trace.task_id == task.id and len(trace.spans) >= 3, trace


def test_deny_with_reason_reaches_the_model(fleet: Fleet, asker: tuple[str, Path]) -> None:
    client = fleet.client()
    before = runs(asker[1])
    task = client.submit("asker", "go")
    pending = wait_for("the approval", 60, lambda: [a for a in client.approvals() if a.task_id == task.id])
    client.deny(task.id, reason="not on a Sunday")
    assert "not on a Sunday" in task.wait(timeout=60)
    assert runs(asker[1]) == before


def test_events_resume_after_a_dropped_stream_without_loss_or_duplicates(
    fleet: Fleet, asker: tuple[str, Path], proxy: CuttingProxy
) -> None:
    direct = fleet.client()
    through = fleet.client(hub=f"https://127.0.0.1:{proxy.port}")
    task = direct.submit("asker", "go")
    followed = through.task(task.id)
    got: list[events.Event] = []
    for ev in followed.events():
        got.append(ev)
        if isinstance(ev, events.ApprovalWaiting):
            proxy.cut()  # the stream (and its connection) drops here
            direct.approve(task.id, ev.call_id)
    assert proxy.cuts == 1
    full = [(e.seq, e.kind) for e in direct.task(task.id).events()]
    assert [(e.seq, e.kind) for e in got] == full
    assert full[-1][1] == "task.state" and followed.state == "succeeded"


def test_client_request_id_makes_a_retry_return_the_same_task(fleet: Fleet, asker: tuple[str, Path]) -> None:
    client = fleet.client()
    rid = str(uuid.uuid4())
    a = client.submit("asker", "go", client_request_id=rid)
    b = client.submit("asker", "go", client_request_id=rid)
    assert a.id == b.id
    a.cancel("test over")
    with pytest.raises(agen.Cancelled):
        a.wait(timeout=30)


def test_errors_are_one_class_per_exit_code(fleet: Fleet, asker: tuple[str, Path], tmp_path: Path) -> None:
    client = fleet.client()
    with pytest.raises(agen.NotFound, match="nope"):
        client.submit("nope", "go")
    with pytest.raises(agen.NotFound):
        client.task("0190c0de-0000-7000-8000-000000000000")
    with pytest.raises(agen.Unauthenticated, match="refused the token"):
        fleet.client(token="agen_bogus").deployments()
    assert issubclass(agen.Unauthenticated, agen.PermissionDenied)
    with pytest.raises(agen.Unavailable, match="cannot reach the Hub"):
        agen.Client("http://127.0.0.1:1").deployments()
    (tmp_path / "bad").mkdir()
    with pytest.raises(agen.InvalidArgument, match="agent.md"):
        client.deploy(tmp_path / "bad")
    with pytest.raises(agen.InvalidArgument):
        client.submit("asker", "go", max_tokens=0)
    waiting = client.submit("asker", "go")
    with pytest.raises(agen.WaitTimeout):
        waiting.wait(timeout=0.5)
    waiting.cancel()
    failing = client.submit("asker", "go", timeout=0.05)
    with pytest.raises(agen.TaskFailed) as e:
        failing.wait(timeout=60)
    assert e.value.code == 1 and failing.state == "failed", failing.raw


def test_async_client(fleet: Fleet, asker: tuple[str, Path]) -> None:
    async def main() -> tuple[str, list[str]]:
        client = agen.AsyncClient(fleet.hub, token=fleet.token, ca_file=fleet.ca_file)
        task = await client.submit("asker", "go")
        kinds: list[str] = []
        async for ev in task.events():
            kinds.append(ev.kind)
            if isinstance(ev, events.ApprovalWaiting):
                await client.approve(task.id)
        result = await task.wait(timeout=30)
        assert [a.name for a in await task.artifacts()] == ["report.txt"]
        assert (await client.deployment("asker")).name == "asker"
        return result, kinds

    result, kinds = asyncio.run(main())
    assert result == DONE
    assert kinds[-1] == "task.state" and "approval.requested" in kinds


def test_progress_events_are_typed(fleet: Fleet, tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "report_progress", "arguments": {"step": "reading", "done": 1, "total": 3}}]},
        {"reply": "read"},
    ]
    with FakeModel(steps, agen_bin=str(fleet.env()["AGEN_BIN"])) as model:
        client = fleet.client()
        client.deploy(write_bundle(tmp_path / "reporter", "reporter", model.base_url, workspace=False), wait=True)
        task = client.submit("reporter", "go")
        progress = [e for e in task.events() if isinstance(e, events.Progress)]
        assert task.wait(timeout=30) == "read"
    assert [(p.step, p.done, p.total) for p in progress][:1] == [("reading", 1, 3)], progress


def test_a_deny_override_narrows_the_bundles_permissions(fleet: Fleet, asker: tuple[str, Path]) -> None:
    client = fleet.client()
    before = runs(asker[1])
    task = client.submit("asker", "go", deny=["ws.run"], max_tokens=100_000)
    assert task.raw["tool_overrides"]["deny"] == ["ws.run"]
    kinds = [e.kind for e in task.events()]
    result = task.wait(timeout=30)
    assert "approval.requested" not in kinds, kinds
    assert result.startswith("done: ") and "ran" not in result, result
    assert runs(asker[1]) == before


def test_client_reads_the_agen_environment(fleet: Fleet, asker: tuple[str, Path], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGEN_")}
    env.update(AGEN_HUB=fleet.hub, AGEN_TOKEN=fleet.token, AGEN_CA_FILE=fleet.ca_file,
               AGEN_CONFIG=str(tmp_path / "none.toml"), PYTHONPATH=os.pathsep.join(sys.path))
    code = "import agen; c = agen.Client(); print(c.url, c.namespace, 'asker' in [d.name for d in c.deployments()])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [fleet.hub, "default", "True"], out.stderr
    env.pop("AGEN_HUB")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "InvalidArgument" in out.stderr and "no Hub to talk to" in out.stderr, out.stderr


def test_a_delegate_call_is_a_child_started_event(fleet: Fleet, tmp_path: Path) -> None:
    agen_bin = str(fleet.env()["AGEN_BIN"])
    with FakeModel([{"reply": "hi from the helper"}], agen_bin=agen_bin) as helper_model, FakeModel(
        [{"tool_calls": [{"name": "call_agent", "arguments": {"agent": "helper", "input": "say hi"}}]},
         {"reply_template": "caller got: {{last_tool_result}}"}],
        agen_bin=agen_bin,
    ) as caller_model:
        client = fleet.client()
        client.deploy(write_bundle(tmp_path / "helper", "helper", helper_model.base_url, workspace=False), wait=True)
        caller = write_bundle(tmp_path / "caller", "caller", caller_model.base_url, workspace=False)
        (caller / "x-agen" / "config.json").write_text(
            '{"delegates": [{"deployment": "helper", "description": "says hi"}]}'
        )
        client.deploy(caller, wait=True)
        task = client.submit("caller", "ask the helper")
        children = [e for e in task.events() if isinstance(e, events.ChildStarted)]
        assert task.wait(timeout=60) == "caller got: hi from the helper"
    assert len(children) >= 1 and children[0].agent == "helper", children
    child = client.task(children[0].task_id)
    assert child.deployment == "helper" and child.raw["parent_task"] == task.id
    assert child.wait(timeout=30) == "hi from the helper"
