"""The README's Python examples, run as they are written (each as a program of its own):
the fleet ones against the test fleet through the client config (`AGEN_CONFIG`), the embedded
ones with `OPENAI_BASE_URL` pointing at the scripted fake model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import AGEN_BIN, Fleet, write_bundle

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def run(code: str, cwd: Path, env: dict[str, str]) -> str:
    program = cwd / "example.py"
    program.write_text(code)
    env = {**env, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(program)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{code}\n--- stderr:\n{out.stderr}"
    return out.stdout


def test_every_python_block_is_run_here() -> None:
    assert len(blocks()) == 7


def test_readme_fleet_examples(fleet: Fleet, fake_model: Any, tmp_path: Path) -> None:
    model = fake_model([
        {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "label.txt", "content": "A-1001: shipped"}}]},
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "echo refund-desk"}}]},
        {"reply_template": "answer: {{last_tool_result}}"},
    ])
    write_bundle(tmp_path / "support-agent", "support", model.base_url, ask=["ws.run"])
    sync, asyncio_, triggers, errors = blocks()[:4]

    out = run(sync, tmp_path, fleet.env())
    assert "calling save_artifact" in out and "approving ws.run" in out, out
    assert "answer: exit code: 0\noutput:\nrefund-desk" in out, out
    assert (tmp_path / "label.txt").read_text() == "A-1001: shipped"

    out = run(asyncio_, tmp_path, fleet.env())
    assert "ask the customer first" in out, out

    writer = fake_model([{"reply": "Orders: 3 shipped, 1 refunded.", "chunk_chars": 4, "chunk_delay_ms": 20}])
    write_bundle(tmp_path / "writer-agent", "writer", writer.base_url, workspace=False)
    out = run(triggers, tmp_path, fleet.env())
    lines = out.splitlines()
    assert len(lines) == 4 and lines[0] == "Orders: 3 shipped, 1 refunded.", out
    assert lines[1] == "True" and lines[3] == "True", out
    assert lines[2].startswith("sch") and lines[2].endswith(" True"), out

    out = run(errors, tmp_path, fleet.env())
    assert out.startswith("not found (exit code 4): "), out


def test_readme_embedded_examples(fake_model: Any, tmp_path: Path) -> None:
    first, tools, testing = blocks()[4:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGEN_", "OPENAI_"))}
    env["AGEN_BIN"] = str(AGEN_BIN)
    env["OPENAI_API_KEY"] = "test"

    model = fake_model([
        {"tool_calls": [{"name": "weather", "arguments": {"city": "Oslo"}}]},
        {"reply_template": "{{last_tool_result}}"},
    ])
    assert run(first, tmp_path, {**env, "OPENAI_BASE_URL": model.base_url}) == "Oslo: sunny\n"

    model = fake_model([
        {"tool_calls": [{"name": "order_status", "arguments": {"order": "A-1001"}}]},
        {"tool_calls": [{"name": "refund", "arguments": {"refund": {"order": "A-1001", "cents": 2500}}}]},
        {"tool_calls": [{"name": "refund", "arguments": {"refund": {"order": "A-1001", "cents": 25000}}}]},
        {"reply_template": "{{last_tool_result}}"},
    ])
    out = run(tools, tmp_path, {**env, "OPENAI_BASE_URL": model.base_url})
    assert "order_status -> order A-1001 shipped" in out, out
    assert "refund -> refunded 2500 cents on A-1001" in out, out
    assert out.rstrip().endswith("refunds over 100 EUR need a person"), out
    assert (tmp_path / "agent-runs").is_dir()

    assert run(testing, tmp_path, env) == ""
