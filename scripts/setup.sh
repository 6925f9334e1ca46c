#!/usr/bin/env bash
# Installs the Debian packages ddpcheck needs to build, test and cross-check against PyTorch.
# Idempotent: when every package is already present it does nothing (no apt-get update either).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libgloo-dev librapidcheck-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libbenchmark-dev
  python3-torch python3-numpy
)
# Optional extras: pass --with-browser to get headless Chromium (HTML report test).
if [[ "${1:-}" == "--with-browser" || "${DDPCHECK_WITH_BROWSER:-0}" == "1" ]]; then
  packages+=(chromium)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
