"""Testing helpers: :class:`FakeModel`, the scripted fake model (``agen fake-model``), which
serves the OpenAI and Anthropic HTTP APIs from a script so an agent's real loop and real tools
run with no network and no key. It is NOT a model: it answers from the script.

A script is a list of steps; the step for a request is the number of assistant turns already
in it (so each conversation follows the script on its own). A step has ``reply``,
``reply_template`` (``{{last_tool_result}}``, ``{{last_user}}``, ``{{turn}}``), ``tool_calls``
(``[{"name": ..., "arguments": {...}}]``), ``delay_ms``, ``status``/``body``, ``usage``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


class FakeModel:
    """``agen fake-model`` running ``steps`` on a port of its own; stop it with :meth:`close`
    (or use it as a context manager). ``agen`` is ``agen_bin``, ``$AGEN_BIN`` or on ``PATH``."""

    def __init__(self, steps: list[dict[str, Any]], *, agen_bin: str | os.PathLike[str] | None = None) -> None:
        binary = agen_bin or os.environ.get("AGEN_BIN") or shutil.which("agen")
        if binary is None:
            raise FileNotFoundError("agen binary not found: pass agen_bin, set AGEN_BIN, or put agen on PATH")
        self._dir = tempfile.TemporaryDirectory(prefix="agen-fake-model-")
        d = Path(self._dir.name)
        self._record = d / "requests.jsonl"
        (d / "script.json").write_text(json.dumps({"steps": steps, "record": str(self._record)}))
        port_file = d / "port"
        self._log = open(d / "log", "wb")
        self._proc = subprocess.Popen(
            [str(binary), "fake-model", "--script", str(d / "script.json"), "--port-file", str(port_file)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while True:
            text = port_file.read_text().strip() if port_file.exists() else ""
            if text.isdigit():
                self.port = int(text)
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"agen fake-model did not start: {(d / 'log').read_text()}")
            time.sleep(0.02)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``base_url=`` of an Agent, ``baseUrl`` of a bundle)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        """Every request the model got (``path``, ``headers``, ``body``), in order."""
        if not self._record.exists():
            return []
        return [json.loads(line) for line in self._record.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        """Stops the model (its whole process group)."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
        self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> FakeModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
