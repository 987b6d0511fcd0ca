#!/usr/bin/env bash
# The CRM follow-up example with an external CRM, under kill -9: for each broker, N meetings are published,
# the worker (with its effect runner in the same process) is killed with SIGKILL at random moments, K times,
# then a last worker runs until every follow-up exists. The external CRM must end with exactly one task per
# meeting, the store with every effect done (none pending, in flight or uncertain), and the broker's dead-letter
# queue empty.
#
# Each queue dead-letters a message only after 2K+2 receives: a worker killed in its long poll leaves that
# receive open at the broker (moto serves it to its end and marks what it finds received, and a real broker
# cannot tell either), so K kills can count up to 2K+1 receives of one message with none of them processed.
# With the queues' usual limits (SQS maxReceiveCount 5, Service Bus MaxDeliveryCount 10) the broker would, by
# chance, dead-letter a message the chaos never let anyone process: correct broker behaviour, but not what this
# test is about (the dead-letter path has its own tests).
#
#   bash scripts/effects-chaos.sh [N] [K]      (default 20 meetings, 6 kills per broker)
#
# Called by scripts/test.sh after the services are up (TXINBOX_SQS_ENDPOINT, the Service Bus emulator's
# exports) and the workspace is built. Every loop is bounded; it stops by itself.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=target/debug
n=${1:-20}
kills=${2:-6}
: "${TXINBOX_SQS_ENDPOINT:?run scripts/moto.sh start first}"
: "${SERVICEBUS_ENDPOINT:?run scripts/sb-emulator.sh start first}"
work=$(mktemp -d)
crm_pid=""
cleanup() {
  [[ -n $crm_pid ]] && kill "$crm_pid" 2>/dev/null || true
  pkill -9 -f "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "effects-chaos: FAILED: $*" >&2
  exit 1
}

# The external CRM (idempotency keys honoured, tasks searchable).
# Each task answers 300 ms after it is created: kills land between the call and its record.
"$bin/txinbox-crm-api" --latency-ms 300 >"$work/crm.out" 2>"$work/crm.err" &
crm_pid=$!
for _ in $(seq 1 100); do grep -q TXINBOX_CRM_URL "$work/crm.out" && break; sleep 0.1; done
eval "$(cat "$work/crm.out")"
: "${TXINBOX_CRM_URL:?the CRM API did not start}"

crm_count() { # tasks at the CRM, and distinct external references among them
  curl -sf "$TXINBOX_CRM_URL/tasks" | python3 -c 'import json,sys
t = json.load(sys.stdin)["tasks"]; print(len(t), len({x["external_ref"] for x in t}))'
}
sqs_dead_letters() { # messages in an SQS queue (moto, through the boto3 moto.sh installed)
  "$root/.build/venv-moto/bin/python" -c 'import boto3,sys
s = boto3.client("sqs", endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
a = s.get_queue_attributes(QueueUrl=sys.argv[2], AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
print(int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"]))' "$TXINBOX_SQS_ENDPOINT" "$1"
}
sb_dead_letters() { # messages in a Service Bus queue's dead-letter queue (the emulator's control API)
  curl -sf "$SERVICEBUS_ENDPOINT/\$emulator/queues" | python3 -c 'import json,sys
print(sum(q["deadLetterMessageCount"] for q in json.load(sys.stdin) if q["path"] == sys.argv[1]))' "$1"
}
effect_states() { # "state=count ..." of the store's effects
  python3 -c 'import sqlite3,sys
try:
    c = sqlite3.connect(sys.argv[1]); print(" ".join(f"{s}={n}" for s, n in c.execute("select state, count(*) from txinbox_effects group by state order by state")))
except sqlite3.Error:
    print("")' "$1"
}

# chaos NAME DB DLQ_COUNT WORKER...: K rounds of start + SIGKILL after a random 0.05-0.9 s, then one worker until
# the CRM holds every task and every effect is done, stopped with SIGTERM. DLQ_COUNT prints the messages the
# broker dead-lettered.
chaos() {
  local name=$1 db=$2 dead_letters=$3 before total distinct dead
  shift 3
  read -r before _ < <(crm_count)
  for i in $(seq 1 "$kills"); do
    "$@" --store "sqlite:$db" --crm-url "$TXINBOX_CRM_URL" >"$work/$name-$i.out" 2>&1 &
    local pid=$!
    sleep "$(python3 -c 'import random; print(round(random.uniform(0.05, 0.9), 2))')"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    read -r total distinct < <(crm_count)
    echo "effects-chaos: $name: after kill -9 #$i: $((total - before)) tasks at the CRM; effects $(effect_states "$db")" >&2
  done
  "$@" --store "sqlite:$db" --crm-url "$TXINBOX_CRM_URL" >"$work/$name-final.out" 2>&1 &
  local pid=$! states
  for _ in $(seq 1 900); do
    read -r total distinct < <(crm_count)
    states=$(effect_states "$db")
    [[ $((total - before)) -ge $n && $states == "done=$n" ]] && break
    dead=$($dead_letters)
    [[ $dead == 0 ]] || fail "$name: the broker dead-lettered $dead message(s) (effects $states)"
    sleep 0.2
  done
  sleep 1 # a (wrong) extra call would show up now
  kill -TERM "$pid"
  wait "$pid" || fail "$name: the last worker exited with an error"
  read -r total distinct < <(crm_count)
  states=$(effect_states "$db")
  [[ $((total - before)) == "$n" && $((distinct - before)) == "$n" ]] ||
    fail "$name: the CRM holds $((total - before)) tasks for $((distinct - before)) follow-ups, expected $n and $n"
  [[ $states == "done=$n" ]] || fail "$name: effects in the store: $states, expected done=$n"
  dead=$($dead_letters)
  [[ $dead == 0 ]] || fail "$name: the broker dead-lettered $dead message(s)"
  echo "effects-chaos: $name ok: $kills x kill -9, then $n tasks at the CRM, one per meeting; effects $states" >&2
}

max_receives=$((2 * kills + 2))
export AWS_ENDPOINT_URL_SQS=$TXINBOX_SQS_ENDPOINT AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
q="crm-chaos-$$"
"$bin/sqs-producer" --queue-name "$q" --create --max-receive-count "$max_receives" --opportunity op_0 --meeting m_0 >/dev/null 2>&1
for i in $(seq 1 $((n - 1))); do
  "$bin/sqs-producer" --queue-name "$q" --opportunity "op_$i" --meeting "m_$i" >/dev/null 2>&1
done
chaos sqs "$work/sqs.db" "sqs_dead_letters $TXINBOX_SQS_ENDPOINT/123456789012/$q-dlq.fifo" "$bin/sqs-crm-worker" --queue-url "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" --visibility-timeout 2 --concurrency 1

q="crm-chaos-sb-$$"
"$bin/servicebus-producer" --queue "$q" --create-on-emulator --lock-secs 3 --max-delivery-count "$max_receives" --opportunity sb_op_0 --meeting m_0 >/dev/null 2>&1
for i in $(seq 1 $((n - 1))); do
  "$bin/servicebus-producer" --queue "$q" --opportunity "sb_op_$i" --meeting "m_$i" >/dev/null 2>&1
done
chaos servicebus "$work/sb.db" "sb_dead_letters $q" "$bin/servicebus-crm-worker" --queue "$q" --dead-letter-to "$q-poison" --lock-duration-secs 3 --concurrency 1
echo "effects-chaos: ok" >&2
