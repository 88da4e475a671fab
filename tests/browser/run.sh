#!/usr/bin/env bash
# The real-browser tests of the admin web console: builds the binaries they
# drive, installs playwright-core (npm ci) when needed, runs `npm test`.
# Needs Node.js >= 20 and Debian's chromium at /usr/bin/chromium (or
# CHROMIUM_BIN). Works from any directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."

echo "== cargo build --bin reflexr --example events_app"
cargo build --bin reflexr --example events_app

cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "== npm ci (tests/browser)"
  npm ci --no-audit --no-fund
  touch node_modules
fi
echo "== npm test (tests/browser)"
npm test
