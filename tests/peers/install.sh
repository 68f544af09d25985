#!/usr/bin/env bash
# Installs the third-party MCP peers the end-to-end tests run, pinned, inside the build tree:
#   target/peers/venv           PyPI mcp (official SDK, used as a client too) + mcp-server-time,
#                               prometheus-client (its text parser reads /metrics scrapes),
#                               grpcio + opentelemetry-proto (the OTLP receiver of the otlp tests),
#                               a2a-sdk (the A2A client of the a2a tests and the remote agent of
#                               the a2a delegate tests)
#   target/peers/node_modules   npm @modelcontextprotocol/server-filesystem, server-everything
# Skips what is already installed at the pinned versions. Safe to run repeatedly.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
peers="$root/target/peers"
mkdir -p "$peers"

stamp="$peers/.installed"
want="$(cat "$here/requirements.txt" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)"
# A venv cannot move: its scripts start with the path of the python of the folder it was made
# in. A build tree copied or linked from another checkout gets a venv of its own.
venv_is_here() {
  [ -x "$peers/venv/bin/python" ] \
    && [ "$(head -n1 "$peers/venv/bin/mcp-server-time" 2>/dev/null)" = "#!$peers/venv/bin/python" ]
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && venv_is_here && [ -d "$peers/node_modules/@modelcontextprotocol/server-filesystem" ]; then
  echo "peers: already installed ($peers)"
  exit 0
fi

echo "peers: installing Python peers into $peers/venv"
if [ -d "$peers/venv" ] && ! venv_is_here && [ -e "$peers/venv/bin/mcp-server-time" ]; then
  echo "peers: $peers/venv was made in another folder; making it again"
  rm -rf "$peers/venv"
fi
[ -x "$peers/venv/bin/python" ] || python3 -m venv "$peers/venv"
"$peers/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"

echo "peers: installing npm peers into $peers/node_modules"
cp "$here/package.json" "$here/package-lock.json" "$peers/"
(cd "$peers" && npm ci --no-audit --no-fund --loglevel=error)

echo "$want" > "$stamp"
echo "peers: done"
