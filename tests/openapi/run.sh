#!/usr/bin/env bash
# Fuzzes the administration server against the OpenAPI document it serves,
# with schemathesis (PyPI, the version pinned in requirements.txt, in a
# virtualenv under target/). The server runs the `reflexr` CLI's `serve` on
# the events app's file, with a token, on a free loopback port; it is
# stopped however this script ends. Works from any directory.
#
# Checks: server errors, status codes, content types, headers, response
# schemas, the token (missing and wrong), unsupported methods and `Allow`,
# schema-violating requests refused, and the stateful ones (a resource gone
# stays gone). Left out: `positive_data_acceptance`, which expects every
# request valid under the schema to succeed — JSON Schema cannot say what
# the server also requires (text limits are in bytes of UTF-8, an integer
# is never written `4.0`, a cursor cannot pass the log's head), so it
# reports what the document already says in words.
#
# REFLEXR_FUZZ_EXAMPLES (default 40) cases per operation and phase;
# REFLEXR_FUZZ_SEED (default 20261201) the seed, so a CI run is repeatable.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

venv="$root/target/schemathesis-venv"
if [ ! -x "$venv/bin/st" ] || [ tests/openapi/requirements.txt -nt "$venv/bin/st" ]; then
  echo "== installing schemathesis (tests/openapi/requirements.txt)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/openapi/requirements.txt
  touch "$venv/bin/st"
fi

echo "== cargo build --workspace --bin reflexr --example events_app"
cargo build --workspace --bin reflexr --example events_app

work="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

target/debug/examples/events_app "$work/app.db" >/dev/null
token="fuzzing-token-$(date +%s)-$$"
echo "$token" >"$work/token"
target/debug/reflexr "$work/app.db" serve --listen 127.0.0.1:0 --token-file "$work/token" \
  >"$work/serve.out" 2>"$work/serve.err" &
server=$!
addr=""
for _ in $(seq 1 200); do
  addr="$(sed -n 's/^serving .* on http:\/\/\([0-9.:]*\).*/\1/p' "$work/serve.out")"
  [ -n "$addr" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/serve.err" >&2; exit 1; }
  sleep 0.05
done
[ -n "$addr" ] || { echo "the server did not say where it listens" >&2; exit 1; }

echo "== schemathesis against http://$addr/api/v1/openapi.json"
"$venv/bin/st" run "http://$addr/api/v1/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks all --exclude-checks positive_data_acceptance \
  --max-examples "${REFLEXR_FUZZ_EXAMPLES:-40}" \
  --seed "${REFLEXR_FUZZ_SEED:-20261201}" \
  --request-timeout 10 \
  --no-color
