#!/usr/bin/env python3
"""The task list at size (BENCHMARKS.md "The web console at 1,000,000 tasks"), run by
tests/soak/console_scale.sh, outside the test suite:

  console_scale.py AGEN_BINARY COUNT WORK_DIR [seeded [HUB_PID]]

Starts a Hub (no Nest) on WORK_DIR, stops it, writes COUNT succeeded tasks into its store with
`agen hub seed-tasks` (label batch=0..9, one millisecond of submission time apart, ending now),
starts it again and measures: the console's Tasks page first page (headless Chromium, from
setting the URL hash to the 50 rows in the DOM) unfiltered and filtered by label, state and
time; `agen tasks` (the CLI process, over gRPC) with the same filters; the Hub's resident
memory. Prints p50 and p99 (nearest rank) of each; fails only when a step fails. `seeded`: the
store in WORK_DIR already holds the COUNT tasks (a Hub on it answered once on WORK_DIR/port);
HUB_PID: a Hub of this binary already runs on it (it is measured, not started or stopped)."""

import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

from playwright.sync_api import sync_playwright

AGEN, COUNT, WORK = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SEEDED = sys.argv[4:5] == ["seeded"]
RUNNING = int(sys.argv[5]) if len(sys.argv) > 5 else None
HUB_DIR = os.path.join(WORK, "hub")
CLIENT = os.path.join(WORK, "client.toml")
BROWSER_RUNS = 7
CLI_RUNS = 21


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PORT_FILE = os.path.join(WORK, "port")
PORT = int(open(PORT_FILE).read()) if SEEDED else free_port()
URL = f"https://127.0.0.1:{PORT}"


def cli(*args):
    env = dict(os.environ, AGEN_CONFIG=CLIENT)
    for k in ("AGEN_HUB", "AGEN_TOKEN", "AGEN_NAMESPACE"):
        env.pop(k, None)
    return subprocess.run([AGEN, *args], env=env, capture_output=True, text=True, timeout=600)


def start_hub():
    env = dict(os.environ, AGEN_CONFIG=CLIENT, RUST_LOG="warn")
    log = open(os.path.join(WORK, "hub.log"), "a")
    hub = subprocess.Popen([AGEN, "hub", "--data-dir", HUB_DIR, "--listen", f"127.0.0.1:{PORT}"],
                           env=env, stdout=log, stderr=log, start_new_session=True)
    started = time.monotonic()
    deadline = started + 1800
    while True:
        assert hub.poll() is None, f"the Hub exited: see {WORK}/hub.log"
        assert time.monotonic() < deadline, "the Hub did not answer within 30 minutes"
        if os.path.exists(CLIENT) and cli("nests", "-o", "json").returncode == 0:
            return hub, time.monotonic() - started
        time.sleep(0.5)


def stop_hub(hub):
    os.killpg(hub.pid, signal.SIGTERM)
    try:
        hub.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(hub.pid, signal.SIGKILL)
        hub.wait()


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))]


def report(what, times):
    print(f"| {what} | {pct(times, 50):.0f} ms | {pct(times, 99):.0f} ms | {len(times)} |", flush=True)


os.makedirs(WORK, exist_ok=True)
if not SEEDED:
    open(PORT_FILE, "w").write(str(PORT))
    hub, _ = start_hub()
    stop_hub(hub)
    seeded = subprocess.run([AGEN, "hub", "seed-tasks", str(COUNT), "--deployment", "many", "--data-dir", HUB_DIR],
                            capture_output=True, text=True)
    assert seeded.returncode == 0, seeded.stderr
    print(seeded.stdout.strip(), flush=True)
if RUNNING is None:
    hub, took = start_hub()
    print(f"the Hub answered {took:.1f} s after it started on them; resident {rss_mib(hub.pid):.0f} MiB", flush=True)
    hub_pid = hub.pid
else:
    hub, hub_pid = None, RUNNING

# The seeded tasks were submitted one millisecond apart up to the newest: a window 40–60 % back
# in that range, the oldest quarter (a time filter that skips most of the index), the newest
# half (the CLI's --since is relative to now).
created = json.loads(cli("tasks", "--limit", "1", "-o", "json").stdout)[0]["created_at"]
newest_ms = datetime.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() * 1000
newest = datetime.datetime.fromtimestamp(newest_ms / 1000)
span = datetime.timedelta(milliseconds=COUNT)
local = lambda t: t.strftime("%Y-%m-%dT%H:%M")
mid_since, mid_until = local(newest - span * 0.6), local(newest - span * 0.4)
old_until = local(newest - span * 0.75)
age_s = time.time() - newest_ms / 1000
newest_half = f"{int(age_s + COUNT / 1000 * 0.5)}s"
oldest_quarter = f"{int(age_s + COUNT / 1000 * 0.75)}s"
FILTERS = [
    ("no filter", "", []),
    ("label batch=3", "label=batch%3D3", ["--label", "batch=3"]),
    ("state succeeded", "state=succeeded", ["--state", "succeeded"]),
    ("state failed (no match: the whole index is read)", "state=failed", ["--state", "failed"]),
    ("submitted in a window 40–60 % back", f"since={mid_since}&until={mid_until}", None),
    ("submitted in the oldest 25 %", f"until={old_until}", None),
    ("submitted in the newest half (--since)", None, ["--since", newest_half]),
    ("submitted in the oldest 25 % (--until)", None, ["--until", oldest_quarter]),
]
print("\n| Tasks page (browser), first page | p50 | p99 | runs |\n|---|---|---|---|")
admin = open(os.path.join(HUB_DIR, "admin-token")).read().strip()
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
    page = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 800}).new_page()
    page.goto(f"{URL}/ui/")
    page.fill("#token", admin)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector('[data-testid="whoami"]')
    for name, query, _ in FILTERS:
        if query is None:
            continue
        times = []
        expect_rows = 0 if query == "state=failed" else 50
        for _ in range(BROWSER_RUNS):
            page.goto(f"{URL}/ui/#/fleet")
            page.wait_for_selector("h1")
            start = time.perf_counter()
            page.evaluate(f"() => {{ location.hash = {json.dumps('#/tasks?' + query)}; }}")
            page.wait_for_function(
                f"""() => document.querySelectorAll('[data-testid="task-row"]').length >= {expect_rows}
                    && /matching/.test((document.querySelector('[data-testid="count"]') || {{}}).textContent || '')""",
                timeout=600_000)
            times.append((time.perf_counter() - start) * 1000)
        report(name, times)
    browser.close()

print("\n| `agen tasks --limit 50` (the CLI process, over gRPC) | p50 | p99 | runs |\n|---|---|---|---|")
for name, _, args in FILTERS:
    if args is None:
        continue
    times = []
    for _ in range(CLI_RUNS):
        start = time.perf_counter()
        out = cli("tasks", "--limit", "50", "-o", "json", *args)
        times.append((time.perf_counter() - start) * 1000)
        assert out.returncode == 0, out.stderr
    report(name, times)
print(f"\nthe Hub's resident memory after the runs: {rss_mib(hub_pid):.0f} MiB", flush=True)
if hub is not None:
    stop_hub(hub)
