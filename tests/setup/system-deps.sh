#!/usr/bin/env bash
# System packages some tests need as real servers or real clients. Installed through
# apt-get when missing and we are root (as on CI); otherwise those tests skip and say why.
set -u
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v curl >/dev/null 2>&1 || need+=(curl)
# The HTTP endpoint's real clients: a feed reader, and the web monitor in headless Chromium.
command -v newsboat >/dev/null 2>&1 || need+=(newsboat)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: not root or no apt-get; tests needing ${need[*]} will be skipped" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
  || echo "system-deps: apt-get failed; tests needing ${need[*]} will be skipped" >&2
exit 0
