# Shared by scripts/*.sh: create ./.venv with Python 3.11+ and install turnlog (editable) into it.
# The install is redone when pyproject.toml changes (hash + extras are listed in .venv/.turnlog-installed).
ensure_venv() {
    local extras="$1"
    local python="${PYTHON:-python3}"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "turnlog needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    [ -x .venv/bin/python ] || "$python" -m venv .venv
    local stamp
    stamp="$(sha256sum pyproject.toml | cut -c1-16)${extras}"
    if ! grep -qxF "$stamp" .venv/.turnlog-installed 2>/dev/null; then
        echo "installing turnlog${extras} into .venv ..." >&2
        if ! { .venv/bin/python -m pip install --upgrade pip \
                && .venv/bin/python -m pip install -e ".${extras}"; } > .venv/install.log 2>&1; then
            tail -n 30 .venv/install.log >&2
            echo "installing turnlog failed (full log: .venv/install.log); check the network access to the" \
                 "package index and that Python has pip and venv (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
        echo "$stamp" >> .venv/.turnlog-installed
    fi
}
