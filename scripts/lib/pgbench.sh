# What the benchmarks that run pgbench against a server share (drop-cost.sh, window-drift.sh). Sourced, not run.
# The sourcing script sets name (its own, for messages), url (the server's) and tables (the tables it works in,
# comma-separated); this checks that pgbench is there, makes $work (a temporary folder), defines q SQL (one
# statement, its result unaligned), and drops the tables now and at exit, when $work is removed too.
command -v pgbench >/dev/null || { echo "$name.sh: pgbench not found (Debian: postgresql-contrib, or postgresql 10+)" >&2; exit 1; }
work=$(mktemp -d)
q() { psql -q -X -tA -v ON_ERROR_STOP=1 "$url" -c "$1"; }
cleanup() {
  q "DROP TABLE IF EXISTS $tables" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
q "DROP TABLE IF EXISTS $tables" 2>/dev/null
