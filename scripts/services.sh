#!/usr/bin/env bash
# Make sure Postgres and Redis are reachable, starting them if they are not, and write the URLs
# to use into .local/services.env (sourced by the Makefile).
#
# Order of preference: the URLs in the environment (or chatq's defaults) if they answer; the
# machine's own services started with their usual commands; private instances under .local/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .local
DATABASE_URL=${DATABASE_URL:-postgresql+psycopg://postgres@localhost:5432/chatq}
REDIS_URL=${REDIS_URL:-redis://localhost:6379/0}

pg_ok() { "$PY" - "$1" <<'PY' >/dev/null 2>&1
import sys, psycopg
from sqlalchemy.engine import make_url
u = make_url(sys.argv[1])
psycopg.connect(host=u.host or "localhost", port=u.port or 5432, user=u.username or "postgres",
                password=u.password, dbname="postgres", connect_timeout=3).close()
PY
}
redis_ok() { "$PY" -c "import sys, redis; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=3).ping()" "$1" >/dev/null 2>&1; }
wait_for() { for _ in $(seq 1 60); do "$@" && return 0; sleep 0.5; done; return 1; }

if ! pg_ok "$DATABASE_URL"; then
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    echo "services: Postgres not answering; starting the machine's cluster" >&2
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start >&2 || true
  fi
  if ! wait_for pg_ok "$DATABASE_URL"; then
    INITDB=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -n1 || true)
    [ -n "$INITDB" ] || { echo "services: Postgres is not reachable at $DATABASE_URL and initdb is not installed (apt-get install postgresql)" >&2; exit 1; }
    PGBIN=$(dirname "$INITDB"); DATA=$PWD/.local/pg; PORT=55432
    echo "services: starting a private Postgres on 127.0.0.1:$PORT in $DATA" >&2
    RUNAS=(); [ "$(id -u)" = 0 ] && { id postgres >/dev/null 2>&1 || useradd -r postgres; chown -R postgres .local; RUNAS=(runuser -u postgres --); }
    [ -f "$DATA/PG_VERSION" ] || "${RUNAS[@]}" "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust >/dev/null
    "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -l "$PWD/.local/pg.log" -o "-p $PORT -k /tmp -c listen_addresses=127.0.0.1" -w start >&2
    DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/chatq"
    wait_for pg_ok "$DATABASE_URL" || { echo "services: the private Postgres did not start; see .local/pg.log" >&2; exit 1; }
  fi
fi

if ! redis_ok "$REDIS_URL"; then
  command -v redis-server >/dev/null || { echo "services: Redis is not reachable at $REDIS_URL and redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }
  if [ "$REDIS_URL" = "redis://localhost:6379/0" ] || [ "$REDIS_URL" = "redis://127.0.0.1:6379/0" ]; then
    echo "services: Redis not answering; starting it on 127.0.0.1:6379" >&2
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || true
  fi
  if ! wait_for redis_ok "$REDIS_URL"; then
    PORT=56379
    echo "services: starting a private Redis on 127.0.0.1:$PORT" >&2
    redis-server --daemonize yes --bind 127.0.0.1 --port $PORT --save "" --appendonly no --dir "$PWD/.local" --logfile "$PWD/.local/redis.log" >&2
    REDIS_URL="redis://127.0.0.1:$PORT/0"
    wait_for redis_ok "$REDIS_URL" || { echo "services: the private Redis did not start; see .local/redis.log" >&2; exit 1; }
  fi
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
