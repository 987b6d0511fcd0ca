#!/usr/bin/env bash
# `cargo package` for every crate meant for crates.io, offline and against Cargo.lock: each crate is packed as
# crates.io would receive it and checked from the packed sources alone (all its features), so a file outside the
# crate (an include_str! of the repository's README), a dependency without a version, a dependency on a crate
# that is not published or a feature a crate uses without enabling it fails here rather than at `cargo publish`.
#
#   bash scripts/package.sh
#
# The crates depend on each other by path and none is on crates.io yet: cargo packages them together
# (`cargo package -p A -p B ...`) and resolves each one's dependencies on the others from the packages it has
# just made (a local registry overlay); the check below points those dependencies at the unpacked packages, so
# nothing needs the network.
#
# The crates meant for crates.io are listed below; every other workspace member must say `publish = false`, so
# that a new crate is a decision, not an accident. The working tree may be dirty (this checks that the crates
# can be packaged; `cargo publish` itself refuses uncommitted files). The packages land in target/package/.
set -euo pipefail

# In dependency order: the core, the stores, the adapters, the Terraform checks, the facade.
PUBLISHED=(txinbox-core txinbox-store txinbox-dynamodb txinbox-sqs txinbox-servicebus txinbox-infra txinbox)
# The facade's features, each checked alone below.
FACADE_FEATURES=(sqlite postgres dynamodb sqs servicebus http health-server)

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
say "cargo package --offline --locked --allow-dirty --no-verify ${args[*]}"
cargo package --offline --locked --allow-dirty --no-verify "${args[@]}" ||
  fail "cargo package failed for the crates meant for crates.io (see above)"

# The verification, done here rather than by cargo's own: cargo builds each package in a workspace of its own,
# which compiles most of the dependency graph once per package (tokio six times: each package enables other
# features of it) and took more than three minutes of the test command. Here the packages are unpacked side by
# side into one scratch workspace whose `[patch.crates-io]` points each crate's dependency on another at its
# unpacked package (what crates.io would serve), with the repository's Cargo.lock. Each package is then linted
# alone with all its features, and the facade with each of its features alone (`cargo clippy -p NAME ... -- -D
# warnings`: the resolver enables only what that package and its dependencies ask for, as for a user who
# depends on it alone). That catches what cargo's verification catches for a library (a file the package lacks,
# a manifest that only works inside the repository, a feature a crate uses but does not enable) and, with
# `-D warnings`, code that warns only under some features (an import only one feature uses). It checks rather
# than builds (no code generation), and all the checks share target/, so a dependency is checked once per set
# of features, not once per package.
version=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print({p["name"]: p["version"] for p in m["packages"]}[sys.argv[2]])' "$meta" txinbox-core)
scratch=$root/target/package/verify
rm -rf "$scratch"
mkdir -p "$scratch"
{
  echo '# Made by scripts/package.sh: the packages as crates.io would serve them, checked one at a time.'
  echo '[workspace]'
  echo 'resolver = "2"'
  echo 'members = ['
  for c in "${PUBLISHED[@]}"; do echo "  \"$c-$version\","; done
  echo ']'
  echo '[patch.crates-io]'
  for c in "${PUBLISHED[@]}"; do echo "$c = { path = \"$c-$version\" }"; done
} >"$scratch/Cargo.toml"
for c in "${PUBLISHED[@]}"; do
  crate=$root/target/package/$c-$version.crate
  [[ -f $crate ]] || fail "cargo package made no $crate"
  tar -xzf "$crate" -C "$scratch" || fail "cannot unpack $crate"
done
cp Cargo.lock "$scratch/Cargo.lock"
lint() {
  cargo clippy --offline --manifest-path "$scratch/Cargo.toml" --target-dir "$root/target" --quiet "$@" -- -D warnings
}
for c in "${PUBLISHED[@]}"; do
  say "clippy -D warnings: $c from its package alone, all features"
  lint -p "$c" --all-features || fail "$c does not build from its package without warnings (target/package/$c-$version.crate; see above)"
done
# The adapters without their default feature (the credential chains: aws-config, azure_identity), as a user who
# builds the SDK client alone gets them.
for c in txinbox-sqs txinbox-servicebus; do
  say "clippy -D warnings: $c from its package alone, --no-default-features"
  lint -p "$c" --no-default-features || fail "$c without its default features does not build without warnings (see above)"
done
# The facade as a user who enables one feature gets it: no other feature's code or dependency features to lean on.
for f in "${FACADE_FEATURES[@]}"; do
  say "clippy -D warnings: txinbox from its package, --no-default-features --features $f"
  lint -p txinbox --no-default-features --features "$f" ||
    fail "txinbox with only the feature $f does not build without warnings (see above)"
done
# The lock file the scratch workspace ended with must pin what the repository's pins: nothing was upgraded.
python3 - "$root/Cargo.lock" "$scratch/Cargo.lock" <<'PY' || fail "the packages resolved other versions than Cargo.lock pins (see above)"
import sys, tomllib
def pins(path):
    return {(p["name"], p["version"]) for p in tomllib.load(open(path, "rb"))["package"]}
repo, scratch = pins(sys.argv[1]), pins(sys.argv[2])
extra = sorted(scratch - repo)
for name, version in extra:
    print(f"package.sh: {name} {version} is not in Cargo.lock", file=sys.stderr)
sys.exit(1 if extra else 0)
PY
say "ok: ${PUBLISHED[*]} packaged (target/package/) and each checked from its package alone"
