#!/usr/bin/env bash
# The console's task list at size, outside the test suite (BENCHMARKS.md "The web console at
# 1,000,000 tasks"):
#   tests/soak/console_scale.sh [COUNT]
# A release build of agen, a Hub with COUNT (default 1,000,000) seeded tasks in a temp dir,
# headless Chromium on its Tasks page and `agen tasks`, each with label, state and time
# filters: p50/p99 and the Hub's resident memory (tests/browser/console_scale.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT="${1:-1000000}"
tests/browser/install.sh >/dev/null
CARGO_INCREMENTAL=0 cargo build --release -p agen-cli --bin agen
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
target/browser/venv/bin/python tests/browser/console_scale.py "$PWD/target/release/agen" "$COUNT" "$work"
