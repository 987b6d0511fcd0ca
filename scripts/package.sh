#!/usr/bin/env bash
# `cargo package` for every crate meant for crates.io, offline and against Cargo.lock: each crate is packed as
# crates.io would receive it and built from the packed sources alone (all its features), so a file outside the
# crate (an include_str! of the repository's README), a dependency without a version or a dependency on a crate
# that is not published fails here rather than at `cargo publish`.
#
#   bash scripts/package.sh
#
# The crates depend on each other by path and none is on crates.io yet: cargo packages them together
# (`cargo package -p A -p B ...`) and resolves each one's dependencies on the others from the packages it has
# just made (a local registry overlay), so the verification needs no network and no --no-verify.
#
# The crates meant for crates.io are listed below; every other workspace member must say `publish = false`, so
# that a new crate is a decision, not an accident. The working tree may be dirty (this checks that the crates
# can be packaged; `cargo publish` itself refuses uncommitted files). The packages land in target/package/.
set -euo pipefail

# In dependency order: the core, the stores, the adapters, the Terraform checks, the facade.
PUBLISHED=(txinbox-core txinbox-store txinbox-dynamodb txinbox-sqs txinbox-servicebus txinbox-infra txinbox)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { echo "package.sh: $*" >&2; }
fail() {
  echo "package.sh: FAILED: $*" >&2
  exit 1
}

command -v cargo >/dev/null || fail "cargo is not installed"
command -v python3 >/dev/null || fail "python3 is needed to read cargo metadata"

# Every member is either in PUBLISHED (and publishable) or says `publish = false`.
meta=$(mktemp)
trap 'rm -f "$meta"' EXIT
cargo metadata --no-deps --format-version 1 --offline --locked >"$meta" || fail "cargo metadata failed"
python3 - "$meta" "${PUBLISHED[@]}" <<'PY' || fail "the workspace's publish settings disagree with the list in scripts/package.sh (see above)"
import json, sys
meta = json.load(open(sys.argv[1]))
listed = set(sys.argv[2:])
members = {p["name"]: p for p in meta["packages"]}
problems = []
for name in sorted(listed - members.keys()):
    problems.append(f"{name}: listed but not a workspace member")
for name, p in sorted(members.items()):
    unpublished = p.get("publish") == []
    if name in listed and unpublished:
        problems.append(f"{name}: listed for crates.io but its manifest says publish = false")
    if name not in listed and not unpublished:
        problems.append(f"{name}: not meant for crates.io but its manifest lacks `publish = false`")
    if name in listed:
        for field in ("description", "license", "repository"):
            if not p.get(field):
                print(f"package.sh: warning: {name} has no `{field}` in its manifest", file=sys.stderr)
        if not p.get("keywords") or not p.get("categories"):
            print(f"package.sh: warning: {name} has no keywords or categories", file=sys.stderr)
for line in problems:
    print(f"package.sh: {line}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY

args=()
for c in "${PUBLISHED[@]}"; do args+=(-p "$c"); done
# Cargo treats a registry crate as immutable: the verification build would reuse the sources an earlier
# packaging unpacked from these crates' packages (the local overlay registry it packs them into, unpacked under
# $CARGO_HOME/registry/src/-<hash>/), and what it compiled from them: same name and version, older content.
# Drop both first. `cargo clean -p` also removes the workspace's own builds of these crates, and of any target
# that shares a name with one (./target/debug/txinbox, the CLI's binary): the next `cargo build` makes them again.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/txinbox-*
cargo clean --offline "${args[@]}" >/dev/null 2>&1 || true
say "cargo package --offline --locked --allow-dirty --all-features ${args[*]}"
cargo package --offline --locked --allow-dirty --all-features "${args[@]}" ||
  fail "cargo package failed for the crates meant for crates.io (see above)"
say "ok: ${PUBLISHED[*]} packaged and built from their packages (target/package/)"
