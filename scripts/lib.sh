# Helpers shared by tests/conformance/run and tests/clients/run. Source it;
# the caller runs under `set -euo pipefail`.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Scratch dir for this run (server data, server log, reports); removed on exit.
TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/runnel-test.XXXXXX")
SERVER_PID=

# Stops the server we started (if any) and removes TEST_TMP. On failure it
# shows the end of the server's log first.
cleanup() {
  local status=$?
  if [[ -n $SERVER_PID ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    # Give it 5 s to shut down cleanly, then force it.
    for _ in {1..50}; do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if ((status != 0)) && [[ -s $TEST_TMP/server.log ]]; then
    echo "--- last 40 lines of the server log ---" >&2
    tail -n 40 "$TEST_TMP/server.log" >&2
  fi
  rm -rf "$TEST_TMP"
}
trap cleanup EXIT
# Turn Ctrl-C / kill into a normal exit so the EXIT trap still runs.
trap 'exit 130' INT
trap 'exit 143' TERM

# Prints a TCP port on 127.0.0.1 that is free right now (the OS picks it).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Succeeds if URL answers 2xx within 1 s.
http_ok() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1" 2>/dev/null
}

# Succeeds if URL answers any HTTP status within 5 s.
http_answers() {
  python3 -c '
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5)
except urllib.error.HTTPError:
    pass' "$1" 2>/dev/null
}

# Sets SERVER_URL. With a URL argument (an already running server) it just
# uses that; otherwise it starts RUNNEL_BIN (default target/release/runnel)
# on a free loopback port with a fresh data dir, and waits up to 20 s for
# GET /healthz to answer 200.
ensure_server() {
  if [[ -n ${1:-} ]]; then
    SERVER_URL=${1%/}
    if ! http_answers "$SERVER_URL/"; then
      echo "error: nothing answers HTTP at $SERVER_URL" >&2
      return 1
    fi
    echo "using the server at $SERVER_URL"
    return
  fi
  local bin=${RUNNEL_BIN:-$REPO_ROOT/target/release/runnel} port
  if [[ ! -x $bin ]]; then
    echo "error: no server binary at $bin (run cargo build --release, or set RUNNEL_BIN)" >&2
    return 1
  fi
  port=$(free_port)
  SERVER_URL=http://127.0.0.1:$port
  mkdir "$TEST_TMP/data"
  "$bin" serve --listen "127.0.0.1:$port" --data-dir "$TEST_TMP/data" \
    --long-poll-timeout-ms 500 >"$TEST_TMP/server.log" 2>&1 &
  SERVER_PID=$!
  local deadline=$((SECONDS + 20))
  until http_ok "$SERVER_URL/healthz"; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "error: $bin exited before it became healthy" >&2
      return 1
    fi
    if ((SECONDS >= deadline)); then
      echo "error: $SERVER_URL/healthz did not answer 200 within 20 s" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "started $bin at $SERVER_URL (pid $SERVER_PID)"
}

# Runs `npm ci` in DIR unless its node_modules was installed from the
# current package-lock.json (we keep a copy of the lock we installed from).
npm_ci_if_stale() {
  local dir=$1
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.installed-lock.json"; then
    (cd "$dir" && npm ci --no-audit --no-fund)
    cp "$dir/package-lock.json" "$dir/node_modules/.installed-lock.json"
  fi
}

# Creates DIR/.venv and installs DIR/requirements.txt into it, unless that
# venv was already made from the current requirements.txt. A download that
# arrives damaged (pip then reports a hash that does not match the index's) is
# fetched once more, bypassing pip's cache; a second failure is the answer.
venv_if_stale() {
  local dir=$1
  if ! cmp -s "$dir/requirements.txt" "$dir/.venv/.installed-requirements.txt"; then
    rm -rf "$dir/.venv"
    python3 -m venv "$dir/.venv"
    "$dir/.venv/bin/pip" install --quiet -r "$dir/requirements.txt" ||
      "$dir/.venv/bin/pip" install --quiet --no-cache-dir -r "$dir/requirements.txt"
    cp "$dir/requirements.txt" "$dir/.venv/.installed-requirements.txt"
  fi
}
