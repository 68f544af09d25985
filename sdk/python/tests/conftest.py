"""Fixtures of the Python SDK's tests: the ``agen`` binary of this checkout, a real fleet
(``agen up`` in a temp dir: a Hub and a Nest) with the scripted fake model, and a TCP proxy
that can cut every connection through it (a dropped event stream)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import agen
from agen.testing import FakeModel

ROOT = Path(__file__).resolve().parents[3]
AGEN_BIN = Path(os.environ.get("AGEN_BIN") or ROOT / "target" / "debug" / "agen")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, seconds: float, check: Any) -> Any:
    """Polls ``check`` until it returns something truthy (bounded), else fails naming ``what``."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except agen.AgenError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def write_bundle(dir: Path, name: str, base_url: str, *, ask: list[str] | None = None, workspace: bool = True) -> Path:
    """A bundle named ``name`` on the fake model at ``base_url``, with ``agen mcp workspace``
    as server ``ws``."""
    (dir / "x-agen").mkdir(parents=True, exist_ok=True)
    (dir / "x-agen" / "agent.md").write_text(
        f"---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {base_url}\n---\nYou are {name}.\n"
    )
    if workspace:
        (dir / "mcp.json").write_text(
            json.dumps({"mcpServers": {"ws": {"command": "agen", "args": ["mcp", "workspace", "--root", "."]}}})
        )
    if ask:
        (dir / "x-agen" / "config.json").write_text(json.dumps({"permissions": {"ask": ask}}))
    return dir


@dataclass
class Fleet:
    """A running ``agen up``: its client config and what is in it."""

    dir: Path
    config: Path
    hub: str
    ca_file: str
    token: str
    port: int

    def client(self, **overrides: Any) -> agen.Client:
        args: dict[str, Any] = {"token": self.token, "ca_file": self.ca_file}
        args.update(overrides)
        return agen.Client(args.pop("hub", self.hub), **args)

    def env(self) -> dict[str, str]:
        """The environment of a program that uses this fleet through the client config."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGEN_")}
        env["AGEN_CONFIG"] = str(self.config)
        env["AGEN_BIN"] = str(AGEN_BIN)
        return env


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    config = tmp / "config.toml"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGEN_")}
    env["AGEN_CONFIG"] = str(config)
    log = open(tmp / "up.log", "wb")
    up = subprocess.Popen(
        [str(AGEN_BIN), "up", "--run-as-self", "--listen", f"127.0.0.1:{port}", "--nests", "1",
         "--data-dir", str(tmp / "data")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
    )
    try:
        wait_for("agen up to write the client config", 60, lambda: config.exists() and "token" in config.read_text())
        cfg = tomllib.loads(config.read_text())
        f = Fleet(tmp, config, str(cfg["hub"]), str(cfg["ca_file"]), str(cfg["token"]), port)
        wait_for("the Hub to answer", 60, lambda: f.client().deployments() is not None)
        yield f
    finally:
        try:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()


@pytest.fixture()
def fake_model() -> Iterator[Any]:
    """A factory of fake models, all stopped when the test ends."""
    made: list[FakeModel] = []

    def start(steps: list[dict[str, Any]]) -> FakeModel:
        m = FakeModel(steps, agen_bin=AGEN_BIN)
        made.append(m)
        return m

    yield start
    for m in made:
        m.close()


class CuttingProxy:
    """A TCP proxy to ``127.0.0.1:port``; :meth:`cut` closes every connection through it."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = int(self.server.getsockname()[1])
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                r, _, _ = select.select([a, b], [], [], 1.0)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    (b if s is a else a).sendall(data)
        except OSError:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
            self.cuts += 1
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        self.cut()


@pytest.fixture()
def proxy(fleet: Fleet) -> Iterator[CuttingProxy]:
    p = CuttingProxy(fleet.port)
    yield p
    p.close()
