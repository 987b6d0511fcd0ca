#!/usr/bin/env bash
# Runs the example producers and workers as real processes against moto and the Service Bus emulator, stops
# each worker with SIGTERM, and checks its report: the resend is dropped by the broker's deduplication, the same
# follow-up under another event id is a business duplicate, and exactly one is applied.
#
# Called by scripts/test.sh after the services are up (it needs TXINBOX_SQS_ENDPOINT and the exports of
# scripts/sb-emulator.sh) and the workspace is built.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=target/debug
: "${TXINBOX_SQS_ENDPOINT:?run scripts/moto.sh start first}"
: "${SERVICEBUS_ENDPOINT:?run scripts/sb-emulator.sh start first}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "examples-smoke: FAILED: $*" >&2
  exit 1
}

# Starts a worker, waits (at most 60 s) until it has logged the business duplicate, which comes after the
# applied event in FIFO order, then sends SIGTERM and checks the report the worker prints on the way out.
run_worker() {
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  for _ in $(seq 1 120); do
    cat "$work/$name.out" "$work/$name.err" | grep -q 'business duplicate' && break
    kill -0 "$pid" 2>/dev/null || fail "$name died: $(tail -n 5 "$work/$name.err")"
    sleep 0.5
  done
  kill -TERM "$pid"
  wait "$pid" || fail "$name exited with an error: $(tail -n 5 "$work/$name.err")"
  grep -q 'WorkerReport.*"applied": 1' "$work/$name.out" || fail "$name: expected applied=1: $(cat "$work/$name.out")"
  grep -q 'WorkerReport.*"business_duplicate": 1' "$work/$name.out" || fail "$name: expected business_duplicate=1: $(cat "$work/$name.out")"
  cat "$work/$name.out" "$work/$name.err" | grep -q 'worker stopped' || fail "$name: no clean stop after SIGTERM"
  echo "examples-smoke: $name ok: $(grep WorkerReport "$work/$name.out")" >&2
}

# SQS FIFO on moto.
export AWS_ENDPOINT_URL_SQS=$TXINBOX_SQS_ENDPOINT AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
q="crm-smoke-$$"
"$bin/sqs-producer" --queue-name "$q" --create --times 2 >&2
"$bin/sqs-producer" --queue-name "$q" --id "evt-other-$$" >&2
RUST_LOG=info run_worker sqs "$bin/sqs-crm-worker" --queue-url "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" --store "sqlite:$work/sqs.db"

# Service Bus on the emulator.
q="crm-smoke-$$"
"$bin/servicebus-producer" --queue "$q" --create-on-emulator --times 2 >&2
"$bin/servicebus-producer" --queue "$q" --id "evt-other-$$" >&2
RUST_LOG=info run_worker servicebus "$bin/servicebus-crm-worker" --queue "$q" --dead-letter-to "$q-poison" --store "sqlite:$work/servicebus.db"
echo "examples-smoke: ok" >&2
