#!/usr/bin/env bash
# Install turnlog with its test dependencies into ./.venv, run the whole test suite, then build
# the docs site strictly (mkdocs.yml).
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
.venv/bin/mypy > .venv/mypy.log 2>&1 & mypy_run=$!  # type-checks while the tests run
status=0
.venv/bin/python -m pytest "$@" || status=$?
if ! wait "$mypy_run"; then
    cat .venv/mypy.log >&2
    echo "mypy found type errors (above)" >&2
    exit 1
fi
tail -n 1 .venv/mypy.log
# the docs site: no broken link, anchor or API reference (offline; a few seconds)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .venv/site || {
    echo "mkdocs build --strict failed (above): fix the page or the docstring it names" >&2
    exit 1
}
exit "$status"
