#!/usr/bin/env bash
# Runs one of the Node.js test projects under tests/ — `browser` (the
# console in headless chromium) or `mcp` (the official MCP SDK clients):
# builds the binaries they drive, installs the locked packages (npm ci)
# when needed, runs `npm test`. Needs Node.js >= 20. Works from any
# directory.
set -euo pipefail
name="${1:?usage: tests/js.sh browser|mcp}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

echo "== cargo build --workspace --bin reflexr --bin bookings --example events_app"
cargo build --workspace --bin reflexr --bin bookings --example events_app

cd "tests/$name"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "== npm ci (tests/$name)"
  npm ci --no-audit --no-fund
  touch node_modules
fi
echo "== npm test (tests/$name)"
npm test
