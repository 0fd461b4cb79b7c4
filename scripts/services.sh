#!/usr/bin/env bash
# scripts/services.sh [start|stop|remove]
#
# start (the default): make sure this clone's Postgres and Redis are reachable, starting them if
# they are not, and record their URLs in .local/services.env (sourced by the Makefile, and read by
# every chatq process started in this directory: chatq/envfile.py).
#
# Which URLs: a clone keeps the services it settled on. An exported DATABASE_URL / REDIS_URL is an
# explicit choice and wins; if it differs from the recorded one, the switch is announced loudly.
# Without one, the URL recorded in .local/services.env is used (so a second terminal without the
# first one's exports never moves the clone to other services); with neither, the defaults below.
#
# For each service, in order:
#   1. the URL answers: use it as it is;
#   2. it names this machine's own service (Postgres cluster on that port, Redis on 6379): start
#      that service with its usual command;
#   3. it names a port on this machine where nothing answers: start a private instance on exactly
#      that port (never another port, never another service);
#   4. otherwise (a remote host, or no server binaries): say what is missing and exit 1.
# Every decision is printed, and no step waits more than a few seconds in silence.
#
# The private Postgres keeps its data in .local/pg and its log in .local/pg.log. As root, initdb
# and postgres run as the `postgres` user, which cannot enter a private folder (a `mktemp -d`,
# /root): there the cluster lives in /var/lib/chatq/pg-<hash of this clone's path>, owned by
# postgres, and .local/pg and .local/pg.log are links to it (`remove` deletes it).
#
# stop: stop this clone's private Postgres and Redis, if they run. remove: stop them and delete
# their data.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ACTION=${1:-start}
mkdir -p .local
RECORD=.local/services.env
DEFAULT_DATABASE_URL=postgresql+psycopg://postgres@localhost:5432/chatq
DEFAULT_REDIS_URL=redis://localhost:6379/0
PG_HOMES=/var/lib/chatq

say() { echo "services: $*" >&2; }
# a URL with its password replaced by ***
mask() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# --- where this clone's private Postgres lives -----------------------------------------------------
RUNAS=()
PG_HOME=""
PG_DATA=$PWD/.local/pg
PG_LOG=$PWD/.local/pg.log
if [ "$(id -u)" = 0 ]; then
  RUNAS=(runuser -u postgres --)
  if [ -d .local/pg ] && [ ! -L .local/pg ] && [ -f .local/pg/PG_VERSION ]; then
    : # a cluster an earlier version made inside the clone (where postgres could enter): keep it
  else
    PG_HOME=$PG_HOMES/pg-$(pwd -P | sha256sum | cut -c1-16)
    PG_DATA=$PG_HOME/data
    PG_LOG=$PG_HOME/pg.log
  fi
fi
PGBIN=""
INITDB=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -n1 || true)
[ -n "$INITDB" ] && PGBIN=$(dirname "$INITDB")

# pg_as cmd...: run a Postgres program as the user that owns the cluster, from a folder it can enter.
pg_as() { if [ -n "$PG_HOME" ]; then (cd "$PG_HOME" && "${RUNAS[@]}" "$@"); else "${RUNAS[@]}" "$@"; fi; }
pg_running() { [ -n "$PGBIN" ] && [ -f "$PG_DATA/PG_VERSION" ] && pg_as "$PGBIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }

stop_private() {
  if pg_running; then
    pg_as "$PGBIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null
    say "stopped this clone's private Postgres (data $PG_DATA)"
  fi
  if [ -f .local/redis.pid ]; then
    local pid i
    pid=$(cat .local/redis.pid)
    # only the process that pid file names, and only while it is that Redis
    if [ -n "$pid" ] && grep -qa redis-server "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid"
      for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      say "stopped this clone's private Redis (pid $pid)"
    fi
    rm -f .local/redis.pid
  fi
}

case "$ACTION" in
  start) ;;
  stop) stop_private; exit 0 ;;
  remove)
    stop_private
    if [ -n "$PG_HOME" ]; then rm -rf "$PG_HOME"; rm -f .local/pg .local/pg.log; else rm -rf .local/pg .local/pg.log; fi
    say "removed this clone's private Postgres data"
    exit 0 ;;
  *) say "usage: scripts/services.sh [start|stop|remove]"; exit 2 ;;
esac

# --- which URLs --------------------------------------------------------------------------------------
# What .local/services.env records, read in a clean shell as the Makefile reads it.
REC_DATABASE_URL=""; REC_REDIS_URL=""
if [ -f "$RECORD" ]; then
  { IFS= read -r REC_DATABASE_URL || true; IFS= read -r REC_REDIS_URL || true; } < <(
    env -i bash -c 'set -a; . ./.local/services.env >/dev/null 2>&1; printf "%s\n%s\n" "${DATABASE_URL-}" "${REDIS_URL-}"')
fi
# By the rules at the top: exported, else recorded, else the default; an exported one that differs
# from the record is a switch, announced once it worked.
SWITCHED=()
for name in DATABASE_URL REDIS_URL; do
  recorded_var=REC_$name default_var=DEFAULT_$name
  if [ -n "${!name:-}" ]; then
    if [ -n "${!recorded_var}" ] && [ "${!name}" != "${!recorded_var}" ]; then
      SWITCHED+=("$name from $(mask "${!recorded_var}") to $(mask "${!name}")")
    fi
  elif [ -n "${!recorded_var}" ]; then
    printf -v "$name" '%s' "${!recorded_var}"
  else
    printf -v "$name" '%s' "${!default_var}"
  fi
done
if [ -n "$REC_DATABASE_URL$REC_REDIS_URL" ] && [ ${#SWITCHED[@]} = 0 ]; then
  say "this clone uses the services recorded in $RECORD (export DATABASE_URL / REDIS_URL to switch)"
fi
for url in "$DATABASE_URL" "$REDIS_URL"; do
  case "$url" in *"'"*) say "a URL with a ' cannot be recorded in $RECORD; write it as %27"; exit 1 ;; esac
done

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

# Where the private cluster goes when root: a folder of its own that postgres owns, linked from .local.
prepare_pg_home() {
  [ -n "$PG_HOME" ] || return 0
  id postgres >/dev/null 2>&1 || useradd -r postgres
  install -d -m 0755 "$PG_HOMES"
  install -d -m 0700 -o postgres "$PG_HOME"
  if [ -d .local/pg ] && [ ! -L .local/pg ]; then
    rmdir .local/pg 2>/dev/null || { say ".local/pg is a folder without a cluster; move it away and run again"; exit 1; }
  fi
  ln -sfn "$PG_DATA" .local/pg
  ln -sfn "$PG_LOG" .local/pg.log
}

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
    port_in_use "$PG_PORT" && { say "something listens on port $PG_PORT but does not answer as Postgres at $(mask "$DATABASE_URL"); not touching it"; exit 1; }
    [ -n "$PGBIN" ] || { say "Postgres is not reachable at $PG_HOST:$PG_PORT and initdb is not installed (apt-get install postgresql)"; exit 1; }
    pg_running && { say "this clone's private Postgres runs on another port than $PG_PORT; run scripts/services.sh stop first"; exit 1; }
    if [ "$(id -u)" = 0 ] && [ -z "$PG_HOME" ]; then chown -R postgres .local; fi
    prepare_pg_home
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
      say "creating a private Postgres cluster in $PG_DATA (once)"
      out=$(pg_as "$PGBIN/initdb" -D "$PG_DATA" -U postgres --auth=trust 2>&1) || { say "initdb failed in $PG_DATA: $(tail -n1 <<<"$out")"; exit 1; }
    fi
    say "starting a private Postgres on 127.0.0.1:$PG_PORT (data .local/pg, log .local/pg.log)"
    pg_as "$PGBIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" -w -t 30 start >/dev/null \
      || { say "the private Postgres did not start; see .local/pg.log"; exit 1; }
    wait_for 30 "the private Postgres" pg_ok "$DATABASE_URL" || { say "the private Postgres did not start; see .local/pg.log"; exit 1; }
  fi
fi

# --- Redis ---------------------------------------------------------------------------------------
{ read -r REDIS_HOST; read -r REDIS_PORT; } < <(url_host_port redis "$REDIS_URL")
if redis_ok "$REDIS_URL"; then
  say "Redis answers at $REDIS_HOST:$REDIS_PORT"
else
  is_local "$REDIS_HOST" || { say "Redis at $REDIS_HOST:$REDIS_PORT does not answer, and it is not on this machine: start it, or point REDIS_URL elsewhere"; exit 1; }
  command -v redis-server >/dev/null || { say "Redis is not reachable at $(mask "$REDIS_URL") and redis-server is not installed (apt-get install redis-server)"; exit 1; }
  port_in_use "$REDIS_PORT" && { say "something listens on port $REDIS_PORT but does not answer as Redis at the URL; not touching it"; exit 1; }
  if [ "$REDIS_PORT" = 6379 ] && [ -d /var/lib/redis ]; then
    say "Redis does not answer on port 6379; starting this machine's Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || true
  else
    say "starting a private Redis on 127.0.0.1:$REDIS_PORT (keeps nothing on disk, log .local/redis.log)"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no --dir "$PWD/.local" \
      --logfile "$PWD/.local/redis.log" --pidfile "$PWD/.local/redis.pid" >&2
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

if [ ${#SWITCHED[@]} -gt 0 ]; then
  say "******************************************************************************************"
  for line in "${SWITCHED[@]}"; do say "SWITCHED this clone's $line (it is exported)"; done
  say "from now on make and chatq in this folder use these, also in terminals without the exports"
  say "******************************************************************************************"
fi
# Single quotes: read alike by the shell (the Makefile sources it) and by chatq/envfile.py.
printf "DATABASE_URL='%s'\nREDIS_URL='%s'\n" "$DATABASE_URL" "$REDIS_URL" > "$RECORD"
