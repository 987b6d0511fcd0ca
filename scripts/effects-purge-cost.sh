#!/usr/bin/env bash
# What maintenance's purge of finished effects costs on a large effects table, with the index of migration 5
# (done effects only) and with migration 6's (`txinbox_effects_finished`). A benchmark, not a test.
#
#   bash scripts/effects-purge-cost.sh [postgres-url] [rows]
#
# It applies the store's PostgreSQL migrations 1 to 5 in a schema of its own (`effects_purge_cost`), fills the
# effects table with `rows` done effects (default 1,000,000) finished over the last 7 days (none yet past
# maintenance's 7-day keep: the state of a table between purges), and times maintenance's purge statement, as
# the store sends it, 5 times: the pass's last batch, which finds fewer rows than its limit, here none. Then it
# applies migration 6 and times it 5 times again. It prints each time, the median of each, and the plan's
# scan of each (EXPLAIN). The schema is dropped at the end.
set -euo pipefail
url=${1:-postgres://postgres@127.0.0.1:5432/test}
rows=${2:-1000000}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mig="$root/crates/txinbox-store/migrations/postgres"
schema=effects_purge_cost
q() { PGOPTIONS="-c search_path=$schema" psql -q -X -tA -v ON_ERROR_STOP=1 "$url" "$@"; }
cleanup() { psql -q -X "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
psql -q -X -v ON_ERROR_STOP=1 "$url" -c "CREATE SCHEMA $schema"
for f in 0001_inbox 0002_effects 0003_operations 0004_tenant_business_key 0005_effect_truth; do
  q -f "$mig/$f.sql"
done
q -c "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, finished_at)
      SELECT 'crm-followup', 'm' || g, 'k' || g, 'task', 'crm', '\x7b7d', '{}', 'r' || g, 'done', now(), now() - interval '7 days' + g * interval '7 days' / $rows, now(), now() - interval '7 days' + g * interval '7 days' / $rows + interval '1 second'
      FROM generate_series(1, $rows) g"
q -c "VACUUM ANALYZE txinbox_effects"
# Maintenance's statement (crates/txinbox-store/src/postgres.rs, PURGE_FINISHED_EFFECTS), before its keep:
# 7 days ago, and a batch of 500.
purge="DELETE FROM txinbox_effects WHERE id IN (SELECT id FROM txinbox_effects WHERE state IN ('done', 'compensated') AND finished_at < now() - interval '7 days' LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING consumer_name"
measure() {
  local label=$1 times=()
  local scan
  scan=$(q -c "EXPLAIN $purge" | grep -oE '(Seq Scan|Index Scan|Index Only Scan|Bitmap Index Scan)( using [a-z_]+)? on txinbox_effects' | head -1)
  for _ in 1 2 3 4 5; do
    times+=("$(q -c "EXPLAIN (ANALYZE, FORMAT JSON) $purge" | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)[0]["Execution Time"])')")
  done
  local median
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
  printf '%-12s rows=%s  ms: %s  median=%s  scan: %s\n' "$label" "$rows" "${times[*]}" "$median" "$scan"
}
measure "migration 5"
q -f "$mig/0006_finished_effects.sql"
q -c "ANALYZE txinbox_effects"
measure "migration 6"
