#!/usr/bin/env bash
# Install turnlog into ./.venv (first run only) and run the demo on the embedded backend.
# Extra arguments go to `turnlog demo` (e.g. --base-url URL --model NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "[local]"
exec .venv/bin/turnlog demo "$@"
