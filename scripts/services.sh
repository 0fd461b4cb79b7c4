#!/usr/bin/env bash
# Make sure the Postgres and Redis that DATABASE_URL and REDIS_URL name are reachable, starting
# them if they are not, and write the URLs into .local/services.env (sourced by the Makefile, and
# read by the `chatq` command run from this directory).
#
# For each service, in order:
#   1. the URL answers: use it as it is;
#   2. it names this machine's own service (Postgres cluster on that port, Redis on 6379): start
#      that service with its usual command;
#   3. it names a port on this machine where nothing answers: start a private instance on exactly
#      that port, with its data and log under .local/ (never another port, never another service);
#   4. otherwise (a remote host, or no server binaries): say what is missing and exit 1.
# Every decision is printed, and no step waits more than a few seconds in silence.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .local
DATABASE_URL=${DATABASE_URL:-postgresql+psycopg://postgres@localhost:5432/chatq}
REDIS_URL=${REDIS_URL:-redis://localhost:6379/0}

say() { echo "services: $*" >&2; }

# host port of a URL, one per line (SQLAlchemy's parser for Postgres, urllib's for Redis)
url_host_port() { "$PY" - "$1" "$2" <<'PY'
import sys
from urllib.parse import urlsplit
kind, url = sys.argv[1], sys.argv[2]
if kind == "pg":
    from sqlalchemy.engine import make_url
    u = make_url(url)
    print(u.host or "localhost"); print(u.port or 5432)
else:
    u = urlsplit(url)
    print(u.hostname or "localhost"); print(u.port or 6379)
PY
}

pg_ok() { "$PY" - "$1" <<'PY' >/dev/null 2>&1
import sys, psycopg
from sqlalchemy.engine import make_url
u = make_url(sys.argv[1])
psycopg.connect(host=u.host or "localhost", port=u.port or 5432, user=u.username or "postgres",
                password=u.password, dbname="postgres", connect_timeout=3).close()
PY
}
redis_ok() { "$PY" -c "import sys, redis; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping()" "$1" >/dev/null 2>&1; }

# wait_for SECONDS WHAT cmd...: poll every 0.5 s, saying once a few seconds in that we are still waiting.
wait_for() {
  local seconds=$1 what=$2; shift 2
  local tries=$((seconds * 2)) i
  for i in $(seq 1 "$tries"); do
    "$@" && return 0
    [ "$i" = 6 ] && say "still waiting for $what..."
    sleep 0.5
  done
  return 1
}

is_local() { case "$1" in localhost|127.0.0.1|::1|"") return 0 ;; *) return 1 ;; esac; }
port_in_use() { "$PY" -c "import socket, sys; s = socket.socket(); s.settimeout(1); sys.exit(0 if s.connect_ex(('127.0.0.1', int(sys.argv[1]))) == 0 else 1)" "$1"; }

# --- Postgres ------------------------------------------------------------------------------------
{ read -r PG_HOST; read -r PG_PORT; } < <(url_host_port pg "$DATABASE_URL")
if pg_ok "$DATABASE_URL"; then
  say "Postgres answers at $PG_HOST:$PG_PORT"
else
  is_local "$PG_HOST" || { say "Postgres at $PG_HOST:$PG_PORT does not answer, and it is not on this machine: start it, or point DATABASE_URL elsewhere"; exit 1; }
  CLUSTER=""
  if command -v pg_lsclusters >/dev/null 2>&1; then
    CLUSTER=$(pg_lsclusters --no-header 2>/dev/null | awk -v port="$PG_PORT" '$3 == port {print $1 " " $2; exit}')
  fi
  if [ -n "$CLUSTER" ]; then
    say "Postgres does not answer on port $PG_PORT; starting this machine's cluster $CLUSTER"
    # shellcheck disable=SC2086
    pg_ctlcluster --skip-systemctl-redirect $CLUSTER start >&2 || true
    wait_for 30 "Postgres cluster $CLUSTER" pg_ok "$DATABASE_URL" || { say "cluster $CLUSTER did not start; see its log under /var/log/postgresql"; exit 1; }
  else
    port_in_use "$PG_PORT" && { say "something listens on port $PG_PORT but does not answer as Postgres at $DATABASE_URL; not touching it"; exit 1; }
    INITDB=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -n1 || true)
    [ -n "$INITDB" ] || { say "Postgres is not reachable at $PG_HOST:$PG_PORT and initdb is not installed (apt-get install postgresql)"; exit 1; }
    PGBIN=$(dirname "$INITDB"); DATA=$PWD/.local/pg
    RUNAS=(); if [ "$(id -u)" = 0 ]; then id postgres >/dev/null 2>&1 || useradd -r postgres; chown -R postgres .local; RUNAS=(runuser -u postgres --); fi
    if [ ! -f "$DATA/PG_VERSION" ]; then
      say "creating a private Postgres cluster in $DATA (once)"
      "${RUNAS[@]}" "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust >/dev/null
    fi
    say "starting a private Postgres on 127.0.0.1:$PG_PORT (data $DATA, log .local/pg.log)"
    "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -l "$PWD/.local/pg.log" -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" -w -t 30 start >/dev/null
    wait_for 30 "the private Postgres" pg_ok "$DATABASE_URL" || { say "the private Postgres did not start; see .local/pg.log"; exit 1; }
  fi
fi

# --- Redis ---------------------------------------------------------------------------------------
{ read -r REDIS_HOST; read -r REDIS_PORT; } < <(url_host_port redis "$REDIS_URL")
if redis_ok "$REDIS_URL"; then
  say "Redis answers at $REDIS_HOST:$REDIS_PORT"
else
  is_local "$REDIS_HOST" || { say "Redis at $REDIS_HOST:$REDIS_PORT does not answer, and it is not on this machine: start it, or point REDIS_URL elsewhere"; exit 1; }
  command -v redis-server >/dev/null || { say "Redis is not reachable at $REDIS_URL and redis-server is not installed (apt-get install redis-server)"; exit 1; }
  port_in_use "$REDIS_PORT" && { say "something listens on port $REDIS_PORT but does not answer as Redis at the URL; not touching it"; exit 1; }
  if [ "$REDIS_PORT" = 6379 ] && [ -d /var/lib/redis ]; then
    say "Redis does not answer on port 6379; starting this machine's Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || true
  else
    say "starting a private Redis on 127.0.0.1:$REDIS_PORT (keeps nothing on disk, log .local/redis.log)"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no --dir "$PWD/.local" --logfile "$PWD/.local/redis.log" >&2
  fi
  wait_for 15 "Redis" redis_ok "$REDIS_URL" || { say "Redis did not start on port $REDIS_PORT; see its log"; exit 1; }
fi

# The application database for `make run` (tests make their own).
"$PY" - "$DATABASE_URL" <<'PY'
import sys, psycopg
from sqlalchemy.engine import make_url
u = make_url(sys.argv[1])
with psycopg.connect(host=u.host or "localhost", port=u.port or 5432, user=u.username or "postgres",
                     password=u.password, dbname="postgres", autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (u.database,)).fetchone():
        conn.execute(f'CREATE DATABASE "{u.database}"')
PY
printf 'DATABASE_URL=%s\nREDIS_URL=%s\n' "$DATABASE_URL" "$REDIS_URL" > .local/services.env
