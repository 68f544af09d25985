"""kill -9 of a Python program mid-run, then the same program resumes the run from its run
log: a side-effecting Python tool that completed is not called again, one the kill interrupted
is reported to the model as `effect_unknown` instead of being called again; an idempotent one
the kill interrupted is called again. A file counts the tool's real executions (one line each,
fsynced)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import AGEN_BIN, wait_for

PROGRAM = '''
import os, sys, time
from agen import Agent, tool

count, run_log, base_url, mode, slow, kind = sys.argv[1:7]

@tool(idempotent=kind == "idempotent")
def charge(cents: int) -> str:
    """Charges the card (a side effect: never twice)."""
    with open(count, "a") as f:
        f.write(f"{cents}\\n")
        f.flush()
        os.fsync(f.fileno())
    if slow == "slow":
        time.sleep(60)
    return f"charged {cents}"

agent = Agent(model="openai/fake", base_url=base_url, api_key="t", tools=[charge], run_log=run_log)
if mode == "start":
    print(agent.run("pay 700", run_id="pay-1").text, flush=True)
else:
    for run_id in agent.unfinished_runs():
        print(run_id, agent.resume(run_id).text, flush=True)
'''


def lines(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


@pytest.mark.parametrize(
    ("when", "kind", "calls"),
    [("after_the_call", "side_effect", 1), ("during_the_call", "side_effect", 1), ("during_the_call", "idempotent", 2)],
)
def test_kill_9_then_resume_never_repeats_the_side_effect(
    when: str, kind: str, calls: int, fake_model: Any, tmp_path: Path
) -> None:
    program = tmp_path / "pay.py"
    program.write_text(PROGRAM)
    count, run_log = tmp_path / "count", tmp_path / "runs"
    env = {**os.environ, "AGEN_BIN": str(AGEN_BIN), "PYTHONPATH": os.pathsep.join(sys.path)}
    slow = "slow" if when == "during_the_call" else "fast"
    # The first model: calls the tool, then hangs on the next turn (the program is killed there).
    first = fake_model([{"tool_calls": [{"name": "charge", "arguments": {"cents": 700}}]}, {"delay_ms": 60000, "reply": "late"}])
    p = subprocess.Popen(
        [sys.executable, str(program), str(count), str(run_log), first.base_url, "start", slow, kind],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        wait_for("the tool to run", 30, lambda: lines(count) == 1)
        if when == "after_the_call":
            wait_for("the next model turn (the call is complete)", 30, lambda: len(first.requests()) == 2)
        # else: the tool writes its line and then sleeps 60 s, so the kill lands inside the call
        # (its tool.started is durable in the run log before the call is made)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == -signal.SIGKILL

    # The same program again, on a model that answers at once: it resumes the run.
    second = fake_model([{"tool_calls": [{"name": "charge", "arguments": {"cents": 700}}]}, {"reply_template": "resumed: {{last_tool_result}}"}])
    out = subprocess.run(
        [sys.executable, str(program), str(count), str(run_log), second.base_url, "resume", "fast", kind],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert lines(count) == calls, "the tool ran again on resume" if calls == 1 else "it was not called again"
    if when == "after_the_call" or kind == "idempotent":
        assert out.stdout.strip() == "pay-1 resumed: charged 700", out.stdout
    else:
        assert out.stdout.startswith("pay-1 resumed: ") and "effect_unknown" in out.stdout, out.stdout
    # The answered first turn was not asked again.
    assert len(second.requests()) == 1
