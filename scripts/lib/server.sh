# What the scripts that run a local server for the tests or the benchmark share (moto.sh, dynamodb.sh,
# localstack.sh, sb-emulator.sh): the state under .build/NAME, the messages, the recorded pid and port, waiting
# for the first answer, stop, status and the command line. Sourced, not run. The sourcing script sets root (the
# repository) and name first; it defines answers PORT (exit 0 when the server answers on PORT), print_exports
# PORT, install and start for the functions that use them, and on_stop for what its stop removes besides.
#
# `start` also exports TXINBOX_SERVER_REUSED: 1 when it found the checkout's server already running and printed
# its exports (someone else started it, and will stop it), 0 when it started one. A caller that stops what it
# started (scripts/test.sh) stops only when it was 0: a second run in one checkout must not stop the server the
# first still uses.

state="$root/.build/$name"
pid_file="$state/$name.pid"
port_file="$state/$name.port"
log_file="$state/$name.log"

say() { echo "$name.sh: $*" >&2; }
fail() {
  echo "$name.sh: FAILED: $*" >&2
  exit 1
}

# pip_version PACKAGE: the version of PACKAGE installed in the script's virtual environment ($venv).
pip_version() {
  "$venv/bin/python" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1" 2>/dev/null
}

# free_port [ADDRESS]: a TCP port free on ADDRESS (127.0.0.1 by default; "" for every interface), the kernel's
# choice.
free_port() {
  "${PYTHON:-python3}" -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1]); s.close()' "${1-127.0.0.1}"
}

# The pid recorded by `start`, when that process is still alive.
running_pid() {
  [[ -f "$pid_file" ]] || return 1
  local pid
  pid=$(cat "$pid_file")
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# Exit 0 (after printing the exports) when the recorded server runs and answers.
already_running() {
  local pid
  if pid=$(running_pid) && [[ -f "$port_file" ]] && answers "$(cat "$port_file")"; then
    say "already running (pid $pid) on port $(cat "$port_file"): reused, left running"
    print_exports "$(cat "$port_file")"
    echo "export TXINBOX_SERVER_REUSED=1"
    return 0
  fi
  return 1
}

# await_started PID PORT SERVER SECONDS READY_MESSAGE: records PID and PORT, then waits up to SECONDS for the
# server's first answer; prints READY_MESSAGE and the exports once it answers, fails with its log's tail when it
# exits, kills it and fails when it does not answer in time.
await_started() {
  local pid=$1 port=$2 server=$3 seconds=$4 ready=$5
  echo "$pid" >"$pid_file"
  echo "$port" >"$port_file"
  local _
  for _ in $(seq 1 $((seconds * 5))); do
    if answers "$port"; then
      say "$ready"
      print_exports "$port"
      echo "export TXINBOX_SERVER_REUSED=0"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log_file" >&2 || true
      rm -f "$pid_file"
      fail "$server exited during start-up (port $port); see $log_file"
    fi
    sleep 0.2
  done
  kill "$pid" 2>/dev/null || true
  rm -f "$pid_file"
  fail "$server did not answer on 127.0.0.1:$port within $seconds s; see $log_file"
}

stop() {
  local pid _
  if pid=$(running_pid); then
    kill "$pid"
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    say "stopped (pid $pid)"
  else
    say "not running"
  fi
  rm -f "$pid_file" "$port_file"
  if declare -F on_stop >/dev/null; then on_stop; fi
}

status() {
  local pid
  if pid=$(running_pid) && [[ -f "$port_file" ]] && answers "$(cat "$port_file")"; then
    say "running (pid $pid) on port $(cat "$port_file")"
    print_exports "$(cat "$port_file")"
  else
    say "not running"
    return 1
  fi
}

# The command line: start (the default), stop, status, install.
server_main() {
  case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    install) install ;;
    *)
      echo "usage: $0 start|stop|status|install" >&2
      exit 2
      ;;
  esac
}
