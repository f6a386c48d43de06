#!/usr/bin/env bash
# Installs what tests/bench/bench_peers.py compares Aa with: nats-server, Mosquitto and its
# C clients (Debian packages, through apt-get when we are root) and the peers' Python
# clients in tests/bench/peers/.venv (requirements.txt, pinned), apart from the project's
# environment. Idempotent; bench_peers.py runs it when something is missing.
#
#   bash tests/bench/peers/setup.sh            # PYTHON=python3.11 to choose the interpreter
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export PATH="$PATH:/usr/sbin:/sbin"  # mosquitto installs into /usr/sbin
need=()
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v mosquitto >/dev/null 2>&1 || need+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || need+=(mosquitto-clients)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "peers/setup: not root or no apt-get; install ${need[*]} by hand (bench_peers.py skips what is missing)" >&2
  else
    echo "peers/setup: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Where systemd runs, the packages start their system services (on their default ports):
    # the benchmark starts its own servers on free loopback ports and wants no others.
    if [ -d /run/systemd/system ]; then
      for unit in mosquitto nats-server; do
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
      done
    fi
  fi
fi
py=${PYTHON:-python3}
if [ ! -x "$here/.venv/bin/python" ]; then
  "$py" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
