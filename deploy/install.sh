#!/usr/bin/env bash
# Installs agen and its systemd units on this machine (run as root from the repo root).
#   deploy/install.sh hub     # the Hub
#   deploy/install.sh nest    # a Nest (then edit /etc/agen/nest.env and copy the join token to /etc/agen/join-token, mode 0600)
set -euo pipefail
role="${1:?usage: deploy/install.sh hub|nest}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -p agen-cli
install -m 0755 target/release/agen /usr/local/bin/agen
id agen >/dev/null 2>&1 || useradd --system --home /var/lib/agen --shell /usr/sbin/nologin agen
install -d -m 0755 /etc/agen
case "$role" in
  hub)
    [ -f /etc/agen/hub.env ] || install -m 0644 deploy/hub.env.example /etc/agen/hub.env
    install -m 0644 deploy/agen-hub.service /etc/systemd/system/agen-hub.service ;;
  nest)
    [ -f /etc/agen/nest.env ] || install -m 0600 deploy/nest.env.example /etc/agen/nest.env
    install -m 0644 deploy/agen-nest.service /etc/systemd/system/agen-nest.service ;;
  *) echo "unknown role $role (hub|nest)" >&2; exit 64 ;;
esac
systemctl daemon-reload
echo "installed; now: systemctl enable --now agen-$role"
