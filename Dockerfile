# chatq: one image for every app service (migrate, worker, beat, flower); the command picks the role.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid so volume permissions are predictable; no login shell, no sudo.
RUN groupadd --system --gid 10001 chatq \
    && useradd --system --uid 10001 --gid chatq --create-home --home-dir /home/chatq --shell /usr/sbin/nologin chatq

WORKDIR /src
# .dockerignore keeps .env, tests and local state out of the build context.
COPY . .
# Runtime dependencies only (no [dev] extra); the source tree is dropped once installed.
RUN pip install . && rm -rf /src

# Run from a directory without sources, so the installed package is what gets imported.
WORKDIR /home/chatq
USER chatq

# `chatq beat` / `chatq flower` (and `chatq worker --processes 1`) exec Celery, so it is PID 1 and gets
# SIGTERM directly; plain `chatq worker` is PID 1 as the supervisor of one Celery worker per CPU the
# container may use (its cpuset), forwarding SIGTERM to each. Under a CPU quota without a cpuset,
# pass `--processes N` (the quota in cores).
ENTRYPOINT ["chatq"]
CMD ["worker"]
