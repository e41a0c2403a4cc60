#!/usr/bin/env bash
# Install turnlog with its test dependencies into ./.venv and run the whole test suite.
# Extra arguments go to pytest (e.g. -k turn_loop, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "[test,local]"
source scripts/_npm.sh
npm_ci_once tests/mcp "the reference MCP servers"
npm_ci_once tests/agui "the AG-UI client"
source scripts/_browser.sh
ensure_chromium
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
