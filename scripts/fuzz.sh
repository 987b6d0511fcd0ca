#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of what reaches txinbox from outside (cargo-fuzz, libFuzzer):
#   bash scripts/fuzz.sh            # every target for 10 s (the bounded run of the test command)
#   bash scripts/fuzz.sh 600        # every target for 10 minutes (the long run)
#   bash scripts/fuzz.sh 60 identity fingerprint   # some targets
#   bash scripts/fuzz.sh build      # only build the targets (the test command builds them in the background)
# Needs the nightly toolchain (libFuzzer's instrumentation); installs cargo-fuzz from crates.io when it is
# missing and fails loudly when it cannot. Corpora grow in fuzz/corpus/<target> (not committed); a crash is
# saved under fuzz/artifacts/<target>/ and fails this script: turn it into a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ONLY=0
if [ "${1:-}" = build ]; then
  BUILD_ONLY=1
  shift
fi
SECONDS_PER_TARGET="${1:-10}"
shift || true
ALL=(identity fingerprint servicebus_wire sqs_message sas_token emulator_request terraform worker_settings)
TARGETS=("${@:-${ALL[@]}}")
if [ "$#" -eq 0 ]; then TARGETS=("${ALL[@]}"); fi

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz.sh: the nightly toolchain is required (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  if ! cargo install cargo-fuzz --locked; then
    echo "fuzz.sh: cannot install cargo-fuzz: no fuzzing was done" >&2
    exit 1
  fi
fi

# No sanitizer: the code under test forbids unsafe, so AddressSanitizer adds cost and finds nothing more;
# panics, overflows (debug assertions are on), timeouts and the allocation limit are what is caught.
FLAGS=(--sanitizer none)
# cargo-fuzz has no --locked: a fuzz/Cargo.lock that no longer matches the workspace would be rewritten by the
# build (a clean clone's test run changing a tracked file). So the locked crates are fetched first with
# --locked, which fails when the lock file would change (and downloads what a fresh machine lacks: the fuzz
# crates, libfuzzer-sys among them, are not the workspace's, so the workspace's fetch does not bring them).
if ! cargo fetch --manifest-path fuzz/Cargo.toml --locked; then
  echo "fuzz.sh: fetching the fuzz crates failed (cargo's message above); if it says the lock file needs to be updated: cargo update --manifest-path fuzz/Cargo.toml --workspace, and commit fuzz/Cargo.lock" >&2
  exit 1
fi
start=$(date +%s)
cargo +nightly fuzz build "${FLAGS[@]}"
echo "fuzz.sh: built in $(( $(date +%s) - start )) s"
if [ "$BUILD_ONLY" = 1 ]; then exit 0; fi

# Two targets at a time (each libFuzzer process is single-threaded): the machine's two cores.
JOBS="${FUZZ_JOBS:-2}"
run_target() {
  local t=$1
  mkdir -p "fuzz/corpus/$t"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes the code allocate without bound is a crash.
  cargo +nightly fuzz run "${FLAGS[@]}" "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -max_len=8192 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 2>"fuzz/$t.log"
}
declare -A pids=()
failed=()
collect() {
  local t=$1
  if ! wait "${pids[$t]}"; then
    failed+=("$t")
    tail -40 "fuzz/$t.log" >&2
  fi
  echo "fuzz.sh: $t: $(grep -a -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "fuzz/$t.log" | tr '\n' ' ' || true)"
}
running=()
for t in "${TARGETS[@]}"; do
  echo "fuzz.sh: $t for ${SECONDS_PER_TARGET} s"
  run_target "$t" &
  pids[$t]=$!
  running+=("$t")
  if [ "${#running[@]}" -ge "$JOBS" ]; then
    collect "${running[0]}"
    running=("${running[@]:1}")
  fi
done
for t in "${running[@]}"; do collect "$t"; done
echo "fuzz.sh: total $(( $(date +%s) - start )) s"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: no crash"
