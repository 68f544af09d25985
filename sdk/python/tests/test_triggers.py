"""Streaming, double texting, webhooks and schedules through the fleet client, against a real
Hub and Nest (``agen up``) and the scripted fake model streaming its answers in pieces."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AGEN_BIN, CuttingProxy, Fleet, wait_for, write_bundle

import agen
from agen import events
from agen.testing import FakeModel

# 50 words in pieces of 5 characters 30 ms apart: the answer streams for about 3 s.
ANSWER = "".join(f"word{i} " for i in range(50))


@pytest.fixture(scope="module")
def talker(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("talker")
    with FakeModel([{"reply": ANSWER, "chunk_chars": 5, "chunk_delay_ms": 30}], agen_bin=str(AGEN_BIN)) as model:
        fleet.client().deploy(write_bundle(tmp / "bundle", "talker", model.base_url, workspace=False), wait=True)
        yield "talker"


@pytest.fixture(scope="module")
def idle(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A deployment with no replica: its tasks stay queued."""
    tmp = tmp_path_factory.mktemp("idle")
    fleet.client().deploy(write_bundle(tmp / "bundle", "idle", "http://127.0.0.1:9/v1", workspace=False),
                          replicas=0, wait=False)
    return "idle"


def after_last_reset(pieces: list[events.TextDelta | events.TextReset]) -> str:
    start = max((i for i, p in enumerate(pieces) if isinstance(p, events.TextReset)), default=0)
    return "".join(p.text for p in pieces[start:])


def test_stream_yields_the_answer_as_it_is_written(fleet: Fleet, talker: str) -> None:
    client = fleet.client()
    task = client.submit(talker, "speak")
    pieces = list(task.stream())
    # The iterator ends with the task, whose snapshot is then fresh.
    assert task.state == "succeeded" and task.result == ANSWER
    deltas = [p for p in pieces if isinstance(p, events.TextDelta)]
    assert len(deltas) >= 3, pieces
    assert all(p.seq == 0 and p.turn == 1 and p.attempt == 1 for p in pieces), pieces
    assert after_last_reset(pieces) == ANSWER
    # With `events(deltas=True)`, the durable events come too, in their order.
    task = client.submit(talker, "speak again")
    mixed = list(task.events(deltas=True))
    kinds = [e.kind for e in mixed]
    assert "model.delta" in kinds and "model.answered" in kinds, kinds
    assert kinds.index("model.delta") < kinds.index("model.answered"), kinds
    durable = [e.seq or 0 for e in mixed if not isinstance(e, (events.TextDelta, events.TextReset))]
    assert durable == sorted(durable) and len(set(durable)) == len(durable), durable
    answered = next(e for e in mixed if isinstance(e, events.ModelAnswered))
    assert answered.text == ANSWER
    # Without deltas (the default) no piece comes.
    assert not any(isinstance(e, events.TextDelta) for e in client.task(task.id).events())


def test_a_stream_cut_on_the_way_starts_again_with_the_turn_so_far(
    fleet: Fleet, talker: str, proxy: CuttingProxy
) -> None:
    through = fleet.client(hub=f"https://127.0.0.1:{proxy.port}")
    task = through.submit(talker, "speak")
    pieces: list[events.TextDelta | events.TextReset] = []
    for p in task.stream():
        pieces.append(p)
        if len(pieces) == 3:
            proxy.cut()  # the stream (and its connection) drops mid-answer
    assert proxy.cuts == 1
    assert task.result == ANSWER
    # The stream attached again: it began with a reset carrying the turn's text so far.
    resets = [p for p in pieces if isinstance(p, events.TextReset)]
    assert resets and resets[-1].text and ANSWER.startswith(resets[-1].text), pieces
    assert after_last_reset(pieces) == ANSWER


def test_async_stream(fleet: Fleet, talker: str) -> None:
    async def main() -> tuple[str, str | None]:
        client = agen.AsyncClient(fleet.hub, token=fleet.token, ca_file=fleet.ca_file)
        task = await client.submit(talker, "speak")
        text = ""
        async for p in task.stream():
            text = p.text if isinstance(p, events.TextReset) else text + p.text
        return text, (await task.refresh()).result

    assert asyncio.run(main()) == (ANSWER, ANSWER)


def test_double_texting_reject_names_the_running_task_and_enqueue_runs_after(fleet: Fleet, talker: str) -> None:
    client = fleet.client()
    conversation = f"dt-{uuid.uuid4()}"
    first = client.submit(talker, "one", conversation_key=conversation)
    with pytest.raises(agen.TaskFailed) as e:
        client.submit(talker, "two", conversation_key=conversation, double_texting="reject")
    assert first.id in str(e.value), e.value
    second = client.submit(talker, "two", conversation_key=conversation, double_texting="enqueue")
    assert second.wait(timeout=60) == ANSWER
    first.refresh()
    assert first.state == "succeeded"
    assert first.raw["finished_at"] <= second.raw["started_at"], (first.raw, second.raw)
    with pytest.raises(agen.InvalidArgument):
        client.submit(talker, "three", conversation_key=conversation, double_texting="later")  # type: ignore[arg-type]


def set_secret(fleet: Fleet, tmp: Path, name: str, value: str) -> None:
    f = tmp / "secret"
    f.write_text(value)
    out = subprocess.run([str(AGEN_BIN), "secrets", "set", name, "--from-file", str(f)],
                         env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_webhook_on_submit_is_recorded_with_every_attempt(fleet: Fleet, idle: str, tmp_path: Path) -> None:
    client = fleet.client()
    set_secret(fleet, tmp_path, "AGEN_WEBHOOK_SECRET", "whsec-python-sdk")
    # `agen up`'s Hub allows no internal address: the loopback receiver is refused at every
    # attempt, each recorded.
    task = client.submit(idle, "hello", webhook="http://127.0.0.1:9/hook", webhook_on_waiting=True)
    task.cancel("done")
    got = wait_for("an attempt", 30, lambda: [d for d in task.webhooks() if d.attempts >= 1])
    assert len(got) == 1, got
    d = got[0]
    assert (d.url, d.event, d.state) == ("http://127.0.0.1:9/hook", "task.ended", "pending"), d
    assert "--webhook-allow" in d.last_error and d.delivered_at is None, d
    with pytest.raises(agen.InvalidArgument):
        client.submit(idle, "hello", webhook="ftp://example.com/hook")

    # A deployment's webhook: every task of it is told, signed with the platform secret named.
    set_secret(fleet, tmp_path, "HOOK_SECRET", "whsec-deployment")
    bundle = write_bundle(tmp_path / "hooked", "hooked", "http://127.0.0.1:9/v1", workspace=False)
    client.deploy(bundle, replicas=0, wait=False, webhook="http://127.0.0.1:9/deployment",
                  webhook_secret="HOOK_SECRET")
    task = client.submit("hooked", "hello")
    task.cancel("done")
    got = wait_for("an attempt", 30, lambda: [d for d in task.webhooks() if d.attempts >= 1])
    assert [(d.url, d.event) for d in got] == [("http://127.0.0.1:9/deployment", "task.ended")], got


def test_schedules_create_fire_pause_run_now_resume_delete(fleet: Fleet, idle: str) -> None:
    client = fleet.client()
    with pytest.raises(agen.InvalidArgument, match="cron"):
        client.create_schedule(idle, cron="not a cron", input="tick")
    with pytest.raises(agen.InvalidArgument, match="timezone"):
        client.create_schedule(idle, cron="0 7 * * *", input="tick", timezone="Mars/Olympus")
    s = client.create_schedule(idle, cron="* * * * * *", input="tick", timezone="Europe/Oslo", overlap="allow")
    assert (s.deployment, s.cron, s.timezone, s.overlap, s.catch_up, s.paused) == (
        idle, "* * * * * *", "Europe/Oslo", "allow", "latest", False)
    assert s.next_slot is not None and s.next_slot.tzinfo is not None
    fired = wait_for("a firing", 20, lambda: next(
        (x.last_task_id for x in client.schedules() if x.schedule_id == s.schedule_id and x.last_task_id), None))
    labels = client.task(fired).raw["labels"]
    assert labels["agen.schedule"] == s.schedule_id and labels["agen.schedule.slot"].endswith("Z"), labels
    paused = client.pause_schedule(s.schedule_id)
    assert paused.paused and paused.next_slot is None
    manual = client.run_schedule(s.schedule_id)
    assert manual.raw["labels"]["agen.schedule.slot"] == "manual" and manual.raw["input"] == "tick"
    assert client.resume_schedule(s.schedule_id).paused is False
    client.delete_schedule(s.schedule_id)
    assert s.schedule_id not in [x.schedule_id for x in client.schedules()]
    with pytest.raises(agen.NotFound):
        client.pause_schedule(s.schedule_id)


def test_async_schedules(fleet: Fleet, idle: str) -> None:
    async def main() -> list[str]:
        client = agen.AsyncClient(fleet.hub, token=fleet.token, ca_file=fleet.ca_file)
        s = await client.create_schedule(idle, cron="0 7 * * 1-5", input="morning")
        ids = [x.schedule_id for x in await client.schedules()]
        await client.delete_schedule(s.schedule_id)
        return [i for i in ids if i == s.schedule_id]

    assert len(asyncio.run(main())) == 1

