#!/usr/bin/env bash
# PostgreSQL clusters of the tests' own, for the shards (one worker, several databases): made with the local
# PostgreSQL binaries (initdb, pg_ctl), each on a free loopback port, trust authentication, run as `postgres`.
# Three by default (the shards benchmark); `SHARDS=N` makes N (the test command makes six: tests/tests/shard_chaos.rs
# gives each of its two scenarios a set of three).
#
#   eval "$(bash scripts/pg-shards.sh start)"   # makes and starts them; exports TXINBOX_SHARD_PG_URLS (the URLs,
#                                                # comma-separated), TXINBOX_SHARD_PG_DATA (their data directories)
#                                                # and TXINBOX_SHARD_PG_CTL (pg_ctl)
#   bash scripts/pg-shards.sh stop              # stops the set named by TXINBOX_SHARD_PG_SET (exported by
#                                                # start), or every set of this checkout when it is unset
#
# Each `start` makes a set of its own, recorded in .build/pg-shards/set-*: a second run in one checkout (the test
# command while a benchmark's shards are up) neither stops nor reuses the first's clusters.
#
# A test stops and starts one with `runuser -u postgres -- "$TXINBOX_SHARD_PG_CTL" -D DIR -m immediate stop`
# (a crash: no shutdown checkpoint, recovery at the next start) and `... -D DIR -l DIR/log -w start` (the port
# and the rest are in the cluster's postgresql.conf). The data live under
# /tmp (the clusters run as `postgres`, which must reach them), recorded in .build/pg-shards. `start` prints shell
# `export` lines on stdout and nothing else; progress and errors go to stderr; it exits non-zero with a message
# when a cluster cannot be had: it never skips silently.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state="$root/.build/pg-shards"
SHARDS=${SHARDS:-3}

say() { echo "pg-shards.sh: $*" >&2; }
fail() {
  echo "pg-shards.sh: FAILED: $*" >&2
  exit 1
}

bin() {
  local b
  b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [[ -x $b/initdb && -x $b/pg_ctl ]] || fail "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql: install PostgreSQL (Debian: apt-get install postgresql)"
  echo "$b"
}

as_postgres() {
  if [[ $(id -u) == 0 ]]; then
    runuser -u postgres -- "$@"
  elif [[ $(id -un) == postgres ]]; then
    "$@"
  else
    fail "run as root or as postgres (the clusters run as the postgres user)"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# stop_set FILE: stops the clusters FILE lists, removes their data and FILE.
stop_set() {
  local b dir
  b=$(bin)
  while read -r dir; do
    [[ -d $dir ]] || continue
    as_postgres "$b/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
  done <"$1"
  rm -f "$1"
}

stop() {
  local set
  if [[ -n ${TXINBOX_SHARD_PG_SET:-} ]]; then
    [[ -f $TXINBOX_SHARD_PG_SET ]] && stop_set "$TXINBOX_SHARD_PG_SET"
    return 0
  fi
  # `dirs`: the single set of the script's earlier versions.
  for set in "$state"/set-* "$state/dirs"; do
    [[ -f $set ]] && stop_set "$set"
  done
  return 0
}

start() {
  local b urls=() dirs=() dir port
  b=$(bin)
  id postgres >/dev/null 2>&1 || fail "no postgres user to run the clusters as"
  mkdir -p "$state"
  local set
  set=$(mktemp "$state/set-XXXXXX")
  # A set whose start fails part-way is stopped and removed, not left running.
  trap 'stop_set "$set"' EXIT
  for i in $(seq 1 "$SHARDS"); do
    dir=$(mktemp -d /tmp/txinbox-pg-shard-XXXXXX)
    echo "$dir" >>"$set"
    chown postgres "$dir"
    chmod 700 "$dir"
    as_postgres "$b/initdb" -D "$dir/data" -A trust -U postgres --no-sync >"$dir/initdb.log" 2>&1 ||
      fail "initdb of shard $i failed: $(tail -n 3 "$dir/initdb.log")"
    port=$(free_port)
    # In the cluster's own configuration, so that a plain `pg_ctl -D DIR start` (a test restarting it) finds its
    # port again. Small: six clusters beside the main one on a 2-core machine. fsync stays on (a crash test
    # needs it).
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_buffers = 32MB
max_connections = 60
CONF
    as_postgres "$b/pg_ctl" -D "$dir/data" -l "$dir/data/log" -w -t 60 start >/dev/null ||
      fail "shard $i did not start: $(tail -n 5 "$dir/data/log" 2>/dev/null)"
    as_postgres psql -h 127.0.0.1 -p "$port" -U postgres -qAtc 'select 1' postgres >/dev/null ||
      fail "shard $i started but does not answer on 127.0.0.1:$port"
    urls+=("postgres://postgres@127.0.0.1:$port/postgres")
    dirs+=("$dir/data")
    say "shard $i: PostgreSQL on 127.0.0.1:$port (data $dir/data)"
  done
  trap - EXIT
  local IFS=,
  echo "export TXINBOX_SHARD_PG_URLS='${urls[*]}'"
  echo "export TXINBOX_SHARD_PG_DATA='${dirs[*]}'"
  echo "export TXINBOX_SHARD_PG_CTL='$b/pg_ctl'"
  echo "export TXINBOX_SHARD_PG_SET='$set'"
}

case ${1:-} in
start) start ;;
stop) stop ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
