#!/usr/bin/env bash
# The hostile-client attacks of tests/e2e/hostile_clients.rs at full size, outside the test suite:
#   tests/soak/hostile.sh [CONNECTIONS] [WATCH_OPENS] [TOOL_NAMES]
# - CONNECTIONS (default 1000): tokenless connections each announcing a 2 MB A2A body and
#   sending it slowly (Hub RSS must grow < 50 MB, a legitimate call answer in < 1 s);
# - WATCH_OPENS (default 20000): WatchTask opens from one viewer token (capped, RSS bounded);
# - TOOL_NAMES (default 10000): tool names a model invents (the series stay bounded).
# Each test prints its counts and fails when a bound does not hold.
set -euo pipefail
cd "$(dirname "$0")/../.."
CONNECTIONS="${1:-1000}"
WATCH_OPENS="${2:-20000}"
TOOL_NAMES="${3:-10000}"
ulimit -n 8192 || true
cargo build --bins
log="$(mktemp)"
AGEN_SOAK_CONNECTIONS="$CONNECTIONS" AGEN_SOAK_WATCH_OPENS="$WATCH_OPENS" AGEN_SOAK_TOOL_NAMES="$TOOL_NAMES" \
  cargo test -p agen-tests --test e2e -- --test-threads 1 --nocapture \
  hostile_clients::tokenless hostile_clients::every_stream hostile_clients::a_model_inventing 2>&1 \
  | tee "$log" | grep -E "^test |tokenless|WatchTask x|invented tool names|test result"
grep -q "test result: ok" "$log"
