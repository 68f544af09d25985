#!/usr/bin/env bash
# Installs what the web console's browser test needs, pinned, and skips what is there:
#   /usr/bin/chromium           Debian's chromium (apt-get; never a Playwright browser download)
#   target/browser/venv         PyPI playwright (driving the system chromium)
#   target/browser/node_modules npm axe-core (the accessibility check)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="$root/target/browser"
PLAYWRIGHT=1.65.2
AXE=4.14.1
mkdir -p "$dir"

if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
fi
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
if [ "$("$dir/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))' 2>/dev/null)" != "$PLAYWRIGHT" ]; then
  "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check "playwright==$PLAYWRIGHT"
fi
if [ "$(node -p "require('$dir/node_modules/axe-core/package.json').version" 2>/dev/null)" != "$AXE" ]; then
  (cd "$dir" && [ -f package.json ] || echo '{"name":"agen-browser-test","private":true}' > package.json
   cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "axe-core@$AXE")
fi
echo "browser: chromium $(/usr/bin/chromium --version 2>/dev/null | awk '{print $2}'), playwright $PLAYWRIGHT, axe-core $AXE"
