#!/bin/sh
# Installs a built prfence (cargo build --release) the way the docs assume:
#   /usr/sbin/prfence, /usr/sbin/fence_pr -> prfence (the Fence Agent API is chosen by the name),
#   the systemd unit and, if absent, /etc/prfence/agent.toml.
# Usage: packaging/install.sh [DESTDIR]     (DESTDIR for staging a package; default /)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
dest=${1:-}
bin="$top/target/release/prfence"
[ -x "$bin" ] || { echo "install.sh: $bin is missing: run 'cargo build --release' first" >&2; exit 1; }
install -D -m 0755 "$bin" "$dest/usr/sbin/prfence"
ln -sf prfence "$dest/usr/sbin/fence_pr"
install -D -m 0644 "$here/prfence-agent.service" "$dest/lib/systemd/system/prfence-agent.service"
if [ ! -e "$dest/etc/prfence/agent.toml" ]; then
  install -D -m 0600 "$here/prfence-agent.toml" "$dest/etc/prfence/agent.toml"
fi
echo "installed prfence and fence_pr in $dest/usr/sbin; unit prfence-agent.service; config /etc/prfence/agent.toml"
