#!/usr/bin/env bash
# The OpenTelemetry export's tests (feature `otlp`): an OTLP/HTTP receiver
# on loopback decodes what the engine exports with the official protobuf
# definitions (PyPI's opentelemetry-proto, pinned in requirements.txt, in a
# virtualenv under target/), and tests/it/otel.rs checks the spans, their
# parents and links, their attributes and the metrics. Works from any
# directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

venv="$root/target/otel-venv"
if [ ! -x "$venv/bin/python" ] || [ tests/otel/requirements.txt -nt "$venv/bin/python" ]; then
  echo "== installing opentelemetry-proto (tests/otel/requirements.txt)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/otel/requirements.txt
  touch "$venv/bin/python"
fi
echo "== cargo test -p reflexr --features otlp --test it otel::"
REFLEXR_OTLP_PYTHON="$venv/bin/python" cargo test -p reflexr --features otlp --test it otel::
