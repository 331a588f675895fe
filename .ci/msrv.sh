#!/usr/bin/env bash
# Cargo.toml's rust-version must be at least the newest rust-version among the locked
# dependencies (dev-dependencies included: the tests must build on it too). Newer standard
# library APIs in the crate's own code are caught by clippy's `incompatible_msrv` lint, which
# .ci/run's clippy step denies.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked | python3 -c '
import json, sys

def version(text):
    return tuple(int(part) for part in text.split("."))

meta = json.load(sys.stdin)
ours = next(p for p in meta["packages"] if p["source"] is None)
locked = [p for p in meta["packages"] if p["source"] is not None and p.get("rust_version")]
needed = max(locked, key=lambda p: version(p["rust_version"]))
have, need = ours["rust_version"], needed["rust_version"]
crate = "{} {}".format(needed["name"], needed["version"])
if version(have) < version(need):
    sys.exit("Cargo.toml: rust-version {} is below {}, which the locked {} needs".format(have, need, crate))
print("rust-version {}: the locked dependencies need at most {} ({})".format(have, need, crate))
'
