#!/usr/bin/env bash
# MCP with the official TypeScript SDK clients (see tests/js.sh).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../js.sh" mcp
