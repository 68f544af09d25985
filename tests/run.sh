#!/usr/bin/env bash
# Runs every test of Agen: unit, integration and end-to-end (real binaries, real third-party MCP
# servers, a real PostgreSQL). Installs what the tests need first, so it works on a fresh machine
# that has only the Rust toolchain, Python 3.11 + pip, Node 20 + npm and gcc.
#
#   tests/run.sh            # everything
#   tests/run.sh fleet      # extra arguments filter test names (passed to cargo test)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "test peers (PyPI mcp + mcp-server-time, npm MCP servers)"
tests/peers/install.sh

step "PostgreSQL (Debian postgresql, for agen mcp sql tests)"
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
  else
    sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
fi
ls -d /usr/lib/postgresql/*/bin | head -n1

step "promtool (Debian prometheus, for the metrics and alert rule tests)"
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
fi
promtool --version | head -n1

step "nftables and iproute2 (Debian, for the instance network namespace tests)"
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
if ! has nft || ! has ip; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables iproute2 >/dev/null
  else
    sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables iproute2 >/dev/null
  fi
fi

step "format and lints (cargo fmt --check, clippy -D warnings)"
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build (the agen binary the end-to-end tests start)"
cargo build --workspace --bins --locked

python_sdk=0
if [ $# -eq 0 ]; then
  step "Python SDK (sdk/python: maturin wheel, mypy --strict, pytest against agen up)"
  sdk/python/ci.sh || python_sdk=$?
fi

step "tests"
cargo test --workspace --locked --no-fail-fast -- "$@"

if [ "$#" -eq 0 ]; then
  step "web console in a real browser (Debian chromium, PyPI playwright, npm axe-core)"
  tests/browser/install.sh
  cargo test -p agen-tests --test e2e --locked -- --ignored --exact console::the_web_console_works_in_a_real_browser
fi

if [ "$python_sdk" != 0 ]; then
  echo "the Python SDK step failed (exit $python_sdk; its output is above)" >&2
  exit "$python_sdk"
fi
