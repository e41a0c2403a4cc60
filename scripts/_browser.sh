# Shared by scripts/test.sh: Debian's Chromium for the trace viewer test (driven by Playwright,
# which is told to use /usr/bin/chromium and downloads no browser of its own).
ensure_chromium() {
    command -v chromium >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's chromium for the viewer test ..." >&2
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
                > .venv/apt-chromium.log 2>&1; then
            tail -n 20 .venv/apt-chromium.log >&2
            echo "apt-get install chromium failed (log: .venv/apt-chromium.log)" >&2
            exit 1
        fi
    else
        echo "chromium not found and cannot apt-get it: the viewer test will be skipped" >&2
    fi
}
