#!/usr/bin/env bash
# Installs what building tandem needs beyond the Rust toolchain: HiGHS (the ILP solver) is
# compiled from source by the `highs-sys` crate, which needs cmake, a C++ compiler and libclang
# (for bindgen). Only missing packages are installed; nothing happens when all are present.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
if ! ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'; then
  missing+=(libclang-dev)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "tandem: installing build dependencies: ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "tandem: need root (or sudo) to apt-get install ${missing[*]}" >&2
    exit 1
  }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
