# Shared by scripts/test.sh: the JavaScript packages the tests run, installed with `npm ci` from
# their committed lockfiles, again only when a lockfile changed since the last install.
#   tests/mcp   the reference MCP servers (everything, filesystem) the MCP tests talk to
#   tests/agui  the official AG-UI client (@ag-ui/client) the gateway's AG-UI test drives
npm_ci_once() {
    local dir="$1" what="$2"
    if ! command -v npm >/dev/null 2>&1; then
        echo "the tests need Node.js 18+ and npm for $what (Debian: apt-get install nodejs npm)" >&2
        exit 1
    fi
    local stamp
    stamp="$(sha256sum "$dir/package-lock.json" | cut -c1-16)"
    if [ "$(cat "$dir/node_modules/.turnlog-installed" 2>/dev/null)" != "$stamp" ]; then
        echo "installing $what into $dir/node_modules ..." >&2
        if ! (cd "$dir" && npm ci --no-audit --no-fund) > "$dir/npm-install.log" 2>&1; then
            tail -n 30 "$dir/npm-install.log" >&2
            echo "npm ci failed in $dir (full log: $dir/npm-install.log); check access to the npm registry" >&2
            exit 1
        fi
        echo "$stamp" > "$dir/node_modules/.turnlog-installed"
    fi
}
