#!/usr/bin/env bash
# The console in headless chromium (see tests/js.sh).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../js.sh" browser
