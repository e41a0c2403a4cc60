# Shared by scripts/test.sh: install the AG-UI JavaScript client the gateway tests drive
# (tests/agui, from its package-lock.json) when the lockfile changed since the last install.
ensure_agui_client() {
    local dir=tests/agui
    if ! command -v npm >/dev/null 2>&1; then
        echo "npm not found: the AG-UI client test will be skipped (Debian: apt-get install nodejs npm)" >&2
        return 0
    fi
    local stamp
    stamp="$(sha256sum "$dir/package-lock.json" | cut -c1-16)"
    if [ "$(cat "$dir/node_modules/.turnlog-installed" 2>/dev/null)" != "$stamp" ]; then
        echo "installing the AG-UI client into $dir/node_modules ..." >&2
        if ! (cd "$dir" && npm ci --no-audit --no-fund) > "$dir/npm-install.log" 2>&1; then
            tail -n 30 "$dir/npm-install.log" >&2
            echo "npm ci failed in $dir (full log: $dir/npm-install.log)" >&2
            exit 1
        fi
        echo "$stamp" > "$dir/node_modules/.turnlog-installed"
    fi
}
