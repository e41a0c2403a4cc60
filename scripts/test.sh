#!/usr/bin/env bash
# Install turnlog with its test dependencies into ./.venv and run the whole test suite.
# Extra arguments go to pytest (e.g. -k turn_loop, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "[test]"
source scripts/_npm.sh
ensure_agui_client
source scripts/_browser.sh
ensure_chromium
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
