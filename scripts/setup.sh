#!/usr/bin/env bash
# Installs the Debian packages ddpcheck needs to build, test and cross-check against PyTorch.
# Idempotent: when every package is already present it does nothing (no apt-get update either).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libgloo-dev librapidcheck-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libbenchmark-dev
  libhiredis-dev redis-server iproute2
  python3-torch python3-numpy
  libisal2  # ISA-L's CRC-32 for tools/ddpcheck_torch.py's archives (zlib's is used where it is absent)
  libopenblas0-pthread  # torch on OpenBLAS, as users run it (bench/compare.py refuses the netlib BLAS)
  libblas-dev  # libblas.so to link: at run time libblas.so.3 is OpenBLAS, which reference/blas.h uses for large products
  gnuplot-nox
)
# Headless Chromium renders the HTML report in tests/report_html_browser_test.cc (the test skips without it).
# It is large (~350 MB installed; ~1.5 min of apt on a fast mirror): pass --no-browser or set
# DDPCHECK_WITH_BROWSER=0 to leave it out.
if [[ "${1:-}" != "--no-browser" && "${DDPCHECK_WITH_BROWSER:-1}" != "0" ]]; then
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
