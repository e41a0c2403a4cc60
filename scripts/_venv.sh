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

# The reference MCP servers the tool tests run against, from tests/mcp/package-lock.json.
# `npm ci` is redone when the lockfile changes (its hash is kept in tests/mcp/node_modules).
ensure_mcp_servers() {
    if ! command -v npm >/dev/null 2>&1; then
        echo "the MCP tests need Node.js 18+ and npm (Debian: apt-get install nodejs npm)" >&2
        exit 1
    fi
    local stamp
    stamp="$(sha256sum tests/mcp/package-lock.json | cut -c1-16)"
    if ! grep -qxF "$stamp" tests/mcp/node_modules/.turnlog-installed 2>/dev/null; then
        echo "installing the MCP test servers into tests/mcp/node_modules ..." >&2
        if ! (cd tests/mcp && npm ci --no-audit --no-fund) > /tmp/turnlog-npm-ci.log 2>&1; then
            tail -n 30 /tmp/turnlog-npm-ci.log >&2
            echo "npm ci in tests/mcp failed; check the network access to the npm registry" >&2
            exit 1
        fi
        echo "$stamp" > tests/mcp/node_modules/.turnlog-installed
    fi
}
