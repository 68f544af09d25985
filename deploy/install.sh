#!/usr/bin/env bash
# Installs a built agen binary, its system user, directories and systemd unit (as root).
# Build first, as yourself (never as root on the target): cargo build --release -p agen-cli
#   deploy/install.sh hub  [PATH/TO/agen]   # the Hub
#   deploy/install.sh nest [PATH/TO/agen]   # a Nest (then edit /etc/agen/nest.env and copy the join token to /etc/agen/join-token, mode 0600)
# PATH/TO/agen defaults to target/release/agen of this checkout.
set -euo pipefail
role="${1:?usage: deploy/install.sh hub|nest [PATH/TO/agen]}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${2:-$here/../target/release/agen}"
case "$role" in hub|nest) ;; *) echo "unknown role $role (expected hub or nest)" >&2; exit 2 ;; esac
if [ ! -x "$bin" ]; then
  echo "no agen binary at $bin: build it first with \`cargo build --release -p agen-cli\`, or pass its path" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deploy/install.sh installs system files: run it as root (sudo)" >&2
  exit 5
fi
"$bin" --version >/dev/null
install -m 0755 "$bin" /usr/local/bin/agen
id agen >/dev/null 2>&1 || useradd --system --home-dir /var/lib/agen --no-create-home --shell /usr/sbin/nologin agen
install -d -m 0755 /etc/agen
install -d -m 0700 -o agen -g agen /var/lib/agen "/var/lib/agen/$role"
case "$role" in
  hub)
    [ -f /etc/agen/hub.env ] || install -m 0644 "$here/hub.env.example" /etc/agen/hub.env ;;
  nest)
    [ -f /etc/agen/nest.env ] || install -m 0600 "$here/nest.env.example" /etc/agen/nest.env ;;
esac
install -m 0644 "$here/agen-$role.service" "/etc/systemd/system/agen-$role.service"
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed $(/usr/local/bin/agen --version); now: systemctl enable --now agen-$role"
