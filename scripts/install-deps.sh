#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build, test, benchmark and run
# the demo; does nothing (and needs no network) when everything is present.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential libopenblas-dev zlib1g-dev libstb-dev dataset-fashion-mnist python3-torch python3-numpy; do
    have_pkg "$p" || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${need[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
