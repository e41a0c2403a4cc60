# Shared by scripts/*.sh: create ./.venv with Python 3.11+ and install turnlog (editable) into it.
# The install is redone when pyproject.toml changes (its hash + the extras are listed in
# .venv/.turnlog-installed).
# pip's full output goes to .venv/install.log; what it is fetching and installing is shown as it goes.
ensure_venv() {
    local extras="$1"
    local python="${PYTHON:-python3}"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "turnlog needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    [ -x .venv/bin/python ] || "$python" -m venv .venv
    local stamp
    stamp="$(sha256sum < pyproject.toml | cut -c1-16)${extras}"
    if ! grep -qxF "$stamp" .venv/.turnlog-installed 2>/dev/null; then
        local size=""
        [[ "$extras" == *local* ]] && size=" (with the local model: 22 packages, about 1.1 GB)"
        echo "installing turnlog${extras} into .venv${size}; full log: .venv/install.log" >&2
        if ! { .venv/bin/python -m pip install --upgrade pip \
                && .venv/bin/python -m pip install -e ".${extras}"; } 2>&1 | tee .venv/install.log | _pip_progress; then
            tail -n 30 .venv/install.log >&2
            echo "installing turnlog failed (full log: .venv/install.log); check the network access to the" \
                 "package index and that Python has pip and venv (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
        echo "$stamp" >> .venv/.turnlog-installed
    fi
}

# pip's lines about what it fetches and installs, numbered, on stderr (the rest stays in the log)
_pip_progress() {
    local n=0 line
    while IFS= read -r line; do
        case "$line" in
            Collecting*) n=$((n + 1)); printf '  [%d] %s\n' "$n" "${line#Collecting }" >&2 ;;
            *Downloading*) printf '      %s\n' "${line#"${line%%Downloading*}"}" >&2 ;;
            "Installing collected packages"*) echo "  installing the packages ..." >&2 ;;
            "Successfully installed"*) echo "  done: $(wc -w <<< "${line#Successfully installed }") packages installed" >&2 ;;
        esac
    done
    return 0
}
