#!/usr/bin/env bash
# Runs tandem's test suite on a fresh Debian machine with only the Rust toolchain:
# installs the C++ build dependencies of HiGHS when missing, then builds and tests in release
# (one build profile, so HiGHS compiles once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
cargo test --release --all-targets "$@"
