#!/usr/bin/env python3
"""Measures the web console in headless Chromium (run by tests/e2e/console.rs
console_benchmark): how long the Tasks page takes to show its first page, and the Task page its
trace waterfall, from navigation to the rows in the DOM. Prints the median (p50) and worst of
RUNS (9)."""

import json
import statistics
import sys
import time

from playwright.sync_api import sync_playwright

CFG = json.load(open(sys.argv[1]))
URL = CFG["url"].rstrip("/")
RUNS = 9


def measure(page, hash_, selector, count):
    times = []
    for _ in range(RUNS):
        page.goto(f"{URL}/ui/#/fleet")
        page.wait_for_selector("h1")
        start = time.perf_counter()
        page.evaluate(f"() => {{ location.hash = {json.dumps(hash_)}; }}")
        page.wait_for_function(
            f"() => document.querySelectorAll({json.dumps(selector)}).length >= {count}", timeout=60_000
        )
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
    page = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 800}).new_page()
    page.goto(f"{URL}/ui/")
    page.fill("#token", CFG["admin_token"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector('[data-testid="whoami"]')
    med, worst = measure(page, "#/tasks", '[data-testid="task-row"]', 50)
    print(f"tasks page, first page of 50 of the retained tasks: median {med:.0f} ms, worst {worst:.0f} ms")
    med, worst = measure(page, f"#/task/default/{CFG['wide_task']}", "tr.wf-row", 1000)
    spans = page.evaluate("() => document.querySelectorAll('tr.wf-row').length")
    print(f"task page, trace waterfall of {spans} spans: median {med:.0f} ms, worst {worst:.0f} ms")
    # Where that time goes: the trace's JSON from the Hub, and drawing it alone (from another
    # page, so the task page's live events are not replaying meanwhile).
    page.goto(f"{URL}/ui/#/fleet")
    page.wait_for_selector("h1")
    fetch_ms = page.evaluate(
        f"""async () => {{ const t = performance.now();
            await (await fetch('/ui/api/tasks/default/{CFG['wide_task']}/trace')).json();
            return performance.now() - t; }}"""
    )
    draw_ms = page.evaluate(
        f"""async () => {{ const w = await import('/ui/assets/waterfall.js');
            const tr = await (await fetch('/ui/api/tasks/default/{CFG['wide_task']}/trace')).json();
            const t = performance.now(); const el = w.waterfall(tr, 'default');
            document.body.appendChild(el); el.getBoundingClientRect(); return performance.now() - t; }}"""
    )
    print(f"  of which: GET the trace {fetch_ms:.0f} ms; build and lay out the 1,000 rows {draw_ms:.0f} ms")
    browser.close()
