#!/usr/bin/env bash
# A PostgreSQL server on 127.0.0.1 for tests and local runs: Debian's server package (installed
# with apt if missing), its own cluster in a directory of this repo, a fresh database and role.
#
#   scripts/postgres.sh start | stop | status
#
# Settings (environment):
#   TURNLOG_POSTGRES_PORT   port (default 5432)
#   TURNLOG_POSTGRES_DIR    cluster directory (default ./.services/postgres)
#   TURNLOG_POSTGRES_DB     database created afresh by `start` (default turnlog_test)
# On success `start` prints the DSN, e.g.
#   TURNLOG_POSTGRES_DSN=postgresql://turnlog:turnlog@127.0.0.1:5432/turnlog_test
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PORT="${TURNLOG_POSTGRES_PORT:-5432}"
DIR="${TURNLOG_POSTGRES_DIR:-$ROOT/.services/postgres}"
DB="${TURNLOG_POSTGRES_DB:-turnlog_test}"
ROLE=turnlog
DSN="postgresql://$ROLE:$ROLE@127.0.0.1:$PORT/$DB"

die() { echo "postgres.sh: $*" >&2; exit 1; }

bindir() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$found" ] && echo "$found"
}

install_server() {
    [ -n "$(bindir)" ] && return 0
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed; run: sudo apt-get install postgresql"
    echo "installing PostgreSQL (Debian package postgresql) ..." >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } \
            > /tmp/turnlog-postgres-install.log 2>&1; then
        tail -n 20 /tmp/turnlog-postgres-install.log >&2
        die "apt-get install postgresql failed (log: /tmp/turnlog-postgres-install.log)"
    fi
}

# The server refuses to run as root: as root, run its tools as the postgres user.
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() { [ -f "$DIR/data/postmaster.pid" ] && as_owner "$(bindir)/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; }

psql_admin() { as_owner "$(bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres "$@"; }

start() {
    install_server
    local bin
    bin="$(bindir)"
    mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
        as_owner "$bin/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --no-locale > "$DIR/initdb.log" 2>&1 \
            || { tail -n 20 "$DIR/initdb.log" >&2; die "initdb failed (log: $DIR/initdb.log)"; }
    fi
    if ! running; then
        if ! as_owner "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
                -o "-p $PORT -c listen_addresses=127.0.0.1 -k $DIR -c max_connections=200" start > /dev/null; then
            tail -n 20 "$DIR/server.log" >&2
            die "PostgreSQL did not start on 127.0.0.1:$PORT (log: $DIR/server.log); is the port taken? \
set TURNLOG_POSTGRES_PORT to a free one"
        fi
    fi
    psql_admin <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN PASSWORD '$ROLE';
  END IF;
END \$\$;
DROP DATABASE IF EXISTS $DB WITH (FORCE);
CREATE DATABASE $DB OWNER $ROLE;
SQL
    echo "PostgreSQL is up on 127.0.0.1:$PORT (data $DIR/data, log $DIR/server.log)"
    echo "TURNLOG_POSTGRES_DSN=$DSN"
}

stop() {
    if running; then
        as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -m fast -w stop > /dev/null
        echo "PostgreSQL stopped"
    else
        echo "PostgreSQL is not running"
    fi
}

status() {
    if [ -n "$(bindir)" ] && running; then
        echo "PostgreSQL is running on 127.0.0.1:$PORT; TURNLOG_POSTGRES_DSN=$DSN"
    else
        echo "PostgreSQL is not running"
        return 3
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: scripts/postgres.sh start|stop|status" ;;
esac
