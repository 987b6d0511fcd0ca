#!/usr/bin/env bash
# Starts and stops a local moto server (an AWS emulator) for the txinbox-sqs tests and examples.
#
#   eval "$(bash scripts/moto.sh start)"   # installs moto if needed, starts it, exports TXINBOX_SQS_ENDPOINT
#   bash scripts/moto.sh status            # exit 0 when the recorded server answers
#   bash scripts/moto.sh stop              # stops the server started by `start`
#
# moto is installed into .build/venv-moto on first use (PyPI `moto[server]`). The server listens on 127.0.0.1
# only, on $MOTO_PORT when set, else on a free port. `start` prints shell `export` lines on stdout (and nothing
# else), so it can be eval'ed; progress and errors go to stderr. It exits non-zero with a message when moto
# cannot be installed or does not answer: it never skips silently.
set -euo pipefail

MOTO_VERSION=${MOTO_VERSION:-5.2.5}
PYTHON=${PYTHON:-python3}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.build/venv-moto"
name=moto
# shellcheck source=lib/server.sh
source "$root/scripts/lib/server.sh"

installed_version() { pip_version moto; }

install() {
  if [[ -x "$venv/bin/python" && "$(installed_version || true)" == "$MOTO_VERSION" ]] &&
    "$venv/bin/python" -c 'import moto.server, flask, flask_cors' 2>/dev/null; then
    return 0
  fi
  say "installing moto[server]==$MOTO_VERSION into .build/venv-moto (first use)"
  mkdir -p "$root/.build"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$PYTHON" -m venv "$venv" >&2 || fail "cannot create a virtual environment with $PYTHON (install python3-venv)"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2 ||
    fail "pip could not install moto[server]==$MOTO_VERSION"
  "$venv/bin/python" -c 'import moto.server' 2>/dev/null || fail "moto installed but moto.server does not import"
}

answers() {
  # moto answers GET / with 200 once it is up.
  "$venv/bin/python" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=2).read()
PY
}

print_exports() {
  echo "export TXINBOX_SQS_ENDPOINT=http://127.0.0.1:$1"
  echo "export TXINBOX_MOTO_PID_FILE=$pid_file"
}

start() {
  install
  mkdir -p "$state"
  already_running && return 0
  local port=${MOTO_PORT:-$(free_port)}
  # Dummy credentials only: moto accepts anything, and nothing real must reach it.
  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
    nohup "$venv/bin/python" -m moto.server -H 127.0.0.1 -p "$port" >"$log_file" 2>&1 &
  local pid=$!
  await_started "$pid" "$port" moto 20 "moto $MOTO_VERSION listening on 127.0.0.1:$port (pid $pid, log $log_file)"
}

server_main "$@"
