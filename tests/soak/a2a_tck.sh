#!/usr/bin/env bash
# The official A2A TCK (github.com/a2aproject/a2a-tck, a public repository, not a package
# registry, so it runs outside CI) against one deployment served at an origin of its own:
#   tests/soak/a2a_tck.sh TCK_DIR [CATEGORY...]      (default categories: mandatory capabilities)
# TCK_DIR is a checkout of a2a-tck; its Python deps are installed from PyPI into
# TCK_DIR/.venv on first use (pip install -e TCK_DIR). A throwaway Hub (TLS) and Nest, a
# fake-model deployment `greeter` that answers after 3.5 s (so a task can be continued and
# cancelled while it works) with 8 parallel runs, a submitter token for the TCK
# (A2A_AUTH_TOKEN), `agen a2a serve greeter` on http://localhost:PORT/, and the Hub answering a
# blocking SendMessage after 300 ms (`--a2a-send-wait`: the TCK polls a task it just sent for
# TASK_STATE_WORKING, so the send must come back before the task ends). Prints the TCK's
# summary per category (the full logs, with each skip and failure reason, go to
# target/a2a-tck-<category>.log); exit status 0 only when no category had a failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tck="$(cd "${1:?usage: tests/soak/a2a_tck.sh TCK_DIR [CATEGORY...]}" && pwd)"
shift
categories=("${@:-mandatory}")
[ $# -gt 0 ] || categories=(mandatory capabilities)
cd "$root"
cargo build --bins
agen="$root/target/debug/agen"
if [ ! -x "$tck/.venv/bin/python" ]; then
  python3 -m venv "$tck/.venv"
  "$tck/.venv/bin/pip" install --quiet --disable-pip-version-check -e "$tck"
fi

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export AGEN_CONFIG="$work/client.toml"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_file() { for _ in $(seq 1 300); do [ -s "$1" ] && return 0; sleep 0.1; done; echo "timed out waiting for $1" >&2; return 1; }

hub_port="$(free_port)"
setsid "$agen" hub --data-dir "$work/hub" --listen "127.0.0.1:$hub_port" --a2a-send-wait 300ms \
  >"$work/hub.log" 2>&1 &
pids+=($!)
wait_file "$work/hub/join-token"
wait_file "$work/client.toml"
setsid "$agen" nest --hub "https://127.0.0.1:$hub_port" --join-file "$work/hub/join-token" \
  --name tck --data-dir "$work/nest" >"$work/nest.log" 2>&1 &
pids+=($!)

echo '[{"delay_ms": 3500, "reply": "Hello from the greeter."}]' >"$work/script.json"
setsid "$agen" fake-model --script "$work/script.json" --port-file "$work/model-port" \
  >"$work/model.log" 2>&1 &
pids+=($!)
wait_file "$work/model-port"
mkdir -p "$work/greeter/x-agen"
cat >"$work/greeter/x-agen/agent.md" <<EOF
---
name: greeter
model: openai/fake-model
baseUrl: http://127.0.0.1:$(cat "$work/model-port")/v1
description: Greets whoever writes to it.
---
# greeter

You greet people.
EOF
for _ in $(seq 1 100); do "$agen" nests -o json 2>/dev/null | grep -q '"ready"' && break; sleep 0.2; done
"$agen" deploy "$work/greeter" --name greeter --concurrency 8 --wait >/dev/null
token="$("$agen" tokens create --namespace default --role submitter --name tck -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')"

serve_port="$(free_port)"
setsid "$agen" a2a serve greeter --listen "127.0.0.1:$serve_port" >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "serving deployment" "$work/serve.log" && break; sleep 0.1; done

status=0
for c in "${categories[@]}"; do
  echo "== TCK category $c against http://localhost:$serve_port/"
  (cd "$tck" && A2A_AUTH_TYPE=bearer A2A_AUTH_TOKEN="$token" PYTEST_ADDOPTS="-rfs" \
    .venv/bin/python run_tck.py --sut-url "http://localhost:$serve_port" --category "$c" \
    >"$work/tck-$c.log" 2>&1) || status=1
  grep -E "passed|failed|skipped|error" "$work/tck-$c.log" | grep -E "^=+ |[0-9]+ (passed|failed)" | tail -n 3
  cp "$work/tck-$c.log" "$root/target/a2a-tck-$c.log"
done
echo "full logs: $root/target/a2a-tck-<category>.log"
exit "$status"
