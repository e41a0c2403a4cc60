#!/usr/bin/env bash
# Build turnlog's wheel (pure Python: one for every version) and check what a user installs, as
# .ci/run does on every run: for each Python (3.11, 3.12 and 3.13, from pyenv or PATH;
# TURNLOG_WHEEL_PYTHONS="3.12" picks others), the wheel goes into a clean venv with no extras,
# then [gateway], then [gateway,memory], and each stage runs scripts/smoke_install.py from
# outside the repository:
# only turnlog at the top of site-packages, --version, doctor, demo --scripted, and serve
# answering one message over HTTP (or, without the gateway extra, saying how to install it).
#
#   scripts/wheel.sh            # all three Pythons
#   scripts/wheel.sh 3.12       # one
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
WORK="$ROOT/.wheelcheck"
VERSIONS="${*:-${TURNLOG_WHEEL_PYTHONS:-3.11 3.12 3.13}}"
STAGES=("" "gateway" "gateway,memory")

die() { echo "wheel.sh: $*" >&2; exit 1; }

python_for() {  # the interpreter of a version: pyenv's, else pythonX.Y on PATH
    local version="$1" found
    if command -v pyenv >/dev/null; then
        found="$(ls -d "$(pyenv root)/versions/$version".*/bin/python"$version" 2>/dev/null | sort -V | tail -n 1 || true)"
        [ -n "$found" ] && { echo "$found"; return; }
    fi
    command -v "python$version" || die "no Python $version (install it with pyenv, or set TURNLOG_WHEEL_PYTHONS)"
}

build_wheel() {  # the wheel, built once (by the first Python named)
    local python="$1"
    rm -rf "$WORK/dist" "$ROOT/build"  # setuptools' build/ keeps files a checkout no longer has
    echo "== building the wheel ($python)" >&2
    "$python" -m pip wheel --quiet --no-deps --wheel-dir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
        || { tail -n 30 "$WORK/build.log" >&2; die "building the wheel failed (log: $WORK/build.log)"; }
    WHEEL="$(ls "$WORK/dist"/turnlog-*-py3-none-any.whl)" || die "the wheel is not pure Python: $(ls "$WORK/dist")"
}

check_version() {
    local version="$1" python venv wheel="$WHEEL" stage
    python="$(python_for "$version")"
    venv="$WORK/venv-$version"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    for stage in "${STAGES[@]}"; do
        echo "== Python $version: installing $(basename "$wheel")${stage:+[$stage]}" >&2
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel${stage:+[$stage]}" \
            > "$WORK/install-$version.log" 2>&1 \
            || { tail -n 30 "$WORK/install-$version.log" >&2; die "installing the wheel${stage:+[$stage]} failed"; }
        (cd "$WORK" && "$venv/bin/python" "$ROOT/scripts/smoke_install.py" "$stage" "$WORK/run-$version-${stage:-none}")
    done
}

mkdir -p "$WORK"
read -r first _ <<< "$VERSIONS"
build_wheel "$(python_for "$first")"
for version in $VERSIONS; do
    check_version "$version"
done
echo "wheel.sh: the wheel works on Python $VERSIONS with every extras stage" >&2
