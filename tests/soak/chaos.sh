#!/usr/bin/env bash
# Longer fault campaigns than CI runs (tests/e2e/chaos.rs), outside the test suite:
#   tests/soak/chaos.sh [HUB_KILLS] [NEST_KILLS]
# - HUB_KILLS (default 100): kill -9 of the Hub within 0-2 ms after SubmitTask returns;
# - NEST_KILLS (default 20): kill -9 of the Nest running a task; prints the failover p50;
# - the disk-full loops (tests/e2e/disk_full.rs) with the Hub's disk held full 60 s once
#   (AGEN_DISK_FULL_HOLD_SECS), watchdog pings counted throughout;
# - interrupted tool calls (tests/e2e/interrupted_calls.rs): 20 tool-server kills at random
#   moments under `agen run`, 5 kill rounds of 3 calls in a fleet, 30 live timeouts.
# Both end with counts (acknowledged, terminal, lost, stuck, charged 0/1/2+) and fail when a
# count that must be zero is not. Needs the peers (tests/peers/install.sh) and root for the
# disk-full case.
set -euo pipefail
cd "$(dirname "$0")/../.."
HUB_KILLS="${1:-100}"
NEST_KILLS="${2:-20}"
tests/peers/install.sh >/dev/null
cargo build --bins
log="$(mktemp)"
AGEN_CHAOS_HUB_KILLS="$HUB_KILLS" AGEN_SOAK_NEST_KILLS="$NEST_KILLS" AGEN_DISK_FULL_HOLD_SECS=60 \
  AGEN_SOAK_TOOL_KILLS=20 AGEN_SOAK_TOOL_KILL_ROUNDS=5 AGEN_SOAK_TOOL_TIMEOUTS=30 \
  cargo test -p agen-tests --test e2e -- --include-ignored --test-threads 1 --nocapture \
  chaos:: disk_full:: interrupted_calls:: 2>&1 | tee "$log" \
  | grep -E "^test |fault campaign counts|disk full counts|SOAK|serving again|failover after|executed 0/1/2|test result"
grep -q "test result: ok" "$log"
