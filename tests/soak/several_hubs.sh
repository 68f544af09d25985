#!/usr/bin/env bash
# Longer failover campaigns than CI runs (tests/e2e/several_hubs.rs), outside the test suite:
#   tests/soak/several_hubs.sh [TRIALS]
# TRIALS (default 10) times: two Hubs on one PostgreSQL (a server the test starts), a fleet whose
# Nests know both, 20 side-effecting runs in flight, kill -9 of the leader. Prints for each trial
# how long the follower took to lead and the counts (lost, stuck, charged 0/1/2+), then the
# median and p90 of the takeover times; fails when a count that must be zero is not. Needs the
# peers (tests/peers/install.sh) and Debian's postgresql.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRIALS="${1:-10}"
tests/peers/install.sh >/dev/null
cargo build --bins
log="$(mktemp)"
AGEN_HA_TRIALS="$TRIALS" cargo test -p agen-tests --test e2e -- --test-threads 1 --nocapture \
  several_hubs::leader_killed 2>&1 | tee "$log" | grep -E "^test |fault campaign counts|the follower led|test result"
grep -o "the follower led [0-9.]*m\?s" "$log" | awk '{v=$4; if (v ~ /ms$/) {sub(/ms$/,"",v); v=v/1000} else {sub(/s$/,"",v)}; print v}' \
  | sort -n | awk '{a[NR]=$1} END {if (NR) printf "takeover: median %.2fs p90 %.2fs over %d trials\n", a[int((NR+1)/2)], a[int(NR*0.9+0.999)], NR}'
grep -q "test result: ok" "$log"
