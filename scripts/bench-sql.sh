#!/usr/bin/env bash
# What the inbox's own statements cost in PostgreSQL, measured with pgbench alone (no library in the loop):
# the apply path as the inbox runs it, and variants without one of its parts. A benchmark, not a test.
#
#   bash scripts/bench-sql.sh [postgres-url] [seconds] [clients]
#
# Each variant runs in a fresh schema holding the store's own migration (crates/txinbox-store/migrations).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
url=${1:-postgres://postgres@127.0.0.1:5432/test}
secs=${2:-5}
clients=${3:-8}
jobs=$((clients < 2 ? clients : 2))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

id="'pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text)"
marker="INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) VALUES ('bench', 'urn.bench', $id, 'bench.event', NULL, '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', NULL, NULL, now(), now(), now() + interval '30 days', 'cloudevents_attributes', 1)"
business="INSERT INTO bench_tasks (task_id, message_id) VALUES ('t-' || CAST(:client_id AS text) || '-' || CAST(:n AS text), $id)"

run() { # name, extra DDL, script body
  local schema="bench_sql_$$_$1"
  psql -q "$url" -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE SCHEMA $schema;
SET search_path = $schema;
$(cat "$root/crates/txinbox-store/migrations/postgres/0001_inbox.sql")
CREATE TABLE bench_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL);
$2
SQL
  printf '\\set n random(1, 9000000000000000000)\nBEGIN;\n%s\nCOMMIT;\n' "$3" >"$work/$1.sql"
  local tps
  tps=$(pgbench -n -M prepared -c "$clients" -j "$jobs" -T "$secs" -f "$work/$1.sql" "$url?sslmode=disable&options=-csearch_path%3D$schema" 2>/dev/null |
    awk '/^tps = /{print int($3)}')
  PGOPTIONS="-c client_min_messages=warning" psql -q "$url" -c "DROP SCHEMA $schema CASCADE" >/dev/null
  printf '%-34s %s tps\n' "$1" "$tps"
}

echo "# pgbench -M prepared, $clients clients, ${secs}s each"
run bare "" "$business;"
run inbox_apply "" "$marker ON CONFLICT DO NOTHING; $business;"
run without_retention_index "DROP INDEX txinbox_inbox_retention;" "$marker ON CONFLICT DO NOTHING; $business;"
run btree_retention_index "DROP INDEX txinbox_inbox_retention; CREATE INDEX ON txinbox_inbox (retention_until);" "$marker ON CONFLICT DO NOTHING; $business;"
run without_business_key_index "DROP INDEX txinbox_inbox_business_key;" "$marker ON CONFLICT DO NOTHING; $business;"
run plain_insert_no_on_conflict "" "$marker; $business;"
run marker_only "" "$marker ON CONFLICT DO NOTHING;"
