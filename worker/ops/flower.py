"""`chatq flower [flower options]`: Flower for this app, with authentication required.

Flower by default serves everything, task arguments included, to anyone who can reach its port.
`chatq flower` refuses to start without credentials: basic auth from FLOWER_BASIC_AUTH
(`user:password`, comma-separated for several users) or Flower's OAuth (`--auth`). The only way
to run it open is `--unauthenticated` (our flag) on a loopback address.

Task arguments never show user content: the producer sends `kwargsrepr` with ids and sizes only
(worker/dispatch.py), and that repr is what Flower displays.

Flower exempts `/metrics` (and `/healthcheck`) from its authentication by design. `chatq flower`
runs Flower through this module (`python -m worker.ops.flower`), which first makes `/metrics` ask for
the same credentials as every other page (`require_auth_for_metrics`, the one reach into Flower's
internals), so a Prometheus scraping it sends the basic-auth user and password. `/healthcheck`
stays open for container health checks; it answers "OK" and nothing else.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from worker.envfile import is_placeholder
from worker.errors import ConfigError

UNAUTHENTICATED_FLAG = "--unauthenticated"
"""Our flag (stripped before Flower sees it): allow running without credentials on loopback only."""

LOOPBACK_ADDRESSES = frozenset({"127.0.0.1", "::1", "localhost"})
"""Addresses an unauthenticated Flower may listen on."""

BASIC_AUTH_ENV = "FLOWER_BASIC_AUTH"
"""Flower's own variable for basic-auth credentials (read by Flower itself)."""

DEFAULT_OPTIONS = {
    # Flower keeps every task it has seen in memory; 100000 (its default) grows a long-lived
    # monitor to gigabytes with chat-sized traffic, and Postgres is the real history anyway.
    "max_tasks": "10000",
    # Workers in containers get a new hostname on every restart; forget the dead ones.
    "purge_offline_workers": "600",
}
"""Flower options chatq sets unless given on the command line or as FLOWER_<NAME>."""

_FORMAT_HINT = "user:password, comma-separated for several users"


def _option(arg: str) -> tuple[str, str | None]:
    """The normalised name and value of a `--name=value` argument (value None without `=`)."""
    name, equals, value = arg.lstrip("-").partition("=")
    return name.replace("-", "_").lower(), (value if equals else None)


def _normalise_basic_auth(raw: str, source: str) -> str:
    """Credentials as Flower compares them, or ConfigError naming the problem (never the secret)."""
    entries = [entry.strip() for entry in raw.split(",")]
    for number, entry in enumerate(entries, start=1):
        user, colon, password = entry.partition(":")
        where = f"entry {number} of {source}" if len(entries) > 1 else source
        if not colon or not user or not password:
            raise ConfigError(f"{where} must be {_FORMAT_HINT} (a user and a password separated by ':')")
        if is_placeholder(password):
            # .env.example's password is public: a Flower accepting it is open to anyone who read it.
            raise ConfigError(f"{where} still holds the placeholder password from .env.example; choose a real one")
    return ",".join(entries)


def flower_command(extra_args: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line that runs Flower for chatq, and the environment to run it in.

    Pure: reads only its arguments. Raises ConfigError (one line) when Flower would run without
    authentication anywhere but on loopback. Credentials given as `--basic_auth=...` are moved
    into FLOWER_BASIC_AUTH so they do not show in `ps`.
    """
    env_out = dict(env)
    args: list[str] = []
    basic_auth: str | None = None
    basic_auth_source = BASIC_AUTH_ENV
    unauthenticated = False
    seen: set[str] = set()
    for arg in extra_args:
        if arg == UNAUTHENTICATED_FLAG:
            unauthenticated = True
            continue
        if not arg.startswith("-"):
            args.append(arg)
            continue
        name, value = _option(arg)
        seen.add(name)
        if name in ("basic_auth", "address", "unix_socket", "auth") and value is None:
            # Flower (tornado) only understands --name=value; a split form would fail there anyway.
            raise ConfigError(f"write Flower's {arg} option as {arg}=VALUE")
        if name == "basic_auth":
            basic_auth, basic_auth_source = value, "--basic_auth"  # like Flower: the last one wins
            continue
        args.append(arg)

    if basic_auth is None:
        basic_auth = env.get(BASIC_AUTH_ENV)
    if basic_auth is not None and basic_auth.strip():
        env_out[BASIC_AUTH_ENV] = _normalise_basic_auth(basic_auth, basic_auth_source)
    else:
        # An empty value would switch Flower's auth on with no usable login: be explicit instead.
        env_out.pop(BASIC_AUTH_ENV, None)
        oauth = _last_value(args, "auth") or env.get("FLOWER_AUTH", "")
        if not oauth.strip():
            _check_unauthenticated_allowed(unauthenticated, args, env)
            # Pin the address on the command line, where neither the environment nor a
            # flowerconfig.py can widen it.
            address = _last_value(args, "address") or env.get("FLOWER_ADDRESS", "").strip() or "127.0.0.1"
            args.append(f"--address={address}")

    defaults = [
        f"--{name}={value}"
        for name, value in DEFAULT_OPTIONS.items()
        if name not in seen and f"FLOWER_{name.upper()}" not in env
    ]
    command = [sys.executable, "-m", "worker.ops.flower", "-A", "worker.app:app", "flower", *defaults, *args]
    return command, env_out


def _last_value(args: Sequence[str], wanted: str) -> str | None:
    """The value of the last `--wanted=value` in args (Flower applies them in order)."""
    found: str | None = None
    for arg in args:
        if arg.startswith("-"):
            name, value = _option(arg)
            if name == wanted:
                found = value
    return found


def _check_unauthenticated_allowed(unauthenticated: bool, args: Sequence[str], env: Mapping[str, str]) -> None:
    """ConfigError unless the operator asked for an open Flower and it listens on loopback only."""
    if not unauthenticated:
        raise ConfigError(
            f"Flower needs credentials: set {BASIC_AUTH_ENV} ({_FORMAT_HINT}), "
            f"or pass {UNAUTHENTICATED_FLAG} --address=127.0.0.1 for a local-only Flower"
        )
    if _last_value(args, "unix_socket") or env.get("FLOWER_UNIX_SOCKET", "").strip():
        # Flower creates its unix socket world-accessible (mode 0777).
        raise ConfigError(f"{UNAUTHENTICATED_FLAG} cannot be used with a unix socket; set {BASIC_AUTH_ENV}")
    address = _last_value(args, "address")
    if address is None:
        address = env.get("FLOWER_ADDRESS", "").strip() or None
    if address is not None and address.strip("[]") not in LOOPBACK_ADDRESSES:
        raise ConfigError(
            f"{UNAUTHENTICATED_FLAG} is allowed on 127.0.0.1, ::1 or localhost only, "
            f"not on {address or 'all addresses'}; set {BASIC_AUTH_ENV} to serve Flower there"
        )


def run_flower(extra_args: list[str]) -> NoReturn:
    """Replace this process with Flower (signals then reach it directly), or raise ConfigError.

    The settings are not read here: `chatq flower` (the CLI's edge) checks them first, and Flower's
    Celery app reads them as every chatq process does (celeryconfig.py).
    """
    command, env = flower_command(extra_args, os.environ)
    sys.stdout.flush()
    os.execve(sys.executable, command, env)


def cmd_flower(args: argparse.Namespace, extra: list[str]) -> int:
    """`chatq flower [flower options]`, in the shape of the CLI's pass-through commands."""
    run_flower(extra)


def require_auth_for_metrics() -> bool:
    """Make Flower's `/metrics` require Flower's authentication, as its other pages do; False if not possible.

    Written for Flower 2.2 (`flower.views.monitor.Metrics.get`, served without Tornado's
    `authenticated` decorator that guards the other pages). The same public Tornado decorator is
    applied to it; with basic auth a request without the credentials gets 401, without any auth
    configured (`--unauthenticated` on loopback) nothing changes. If a later Flower moves the
    handler, Flower runs as it ships and `run_celery_flower` says that `/metrics` is open.
    """
    try:
        from flower.views.monitor import Metrics
        from tornado.web import authenticated
    except ImportError:
        return False
    get = vars(Metrics).get("get")
    if get is None or not callable(get):
        return False
    if not getattr(get, "_chatq_authenticated", False):
        guarded = authenticated(get)
        guarded._chatq_authenticated = True  # type: ignore[attr-defined]
        Metrics.get = guarded
    return True


def run_celery_flower(argv: Sequence[str]) -> int:
    """`celery [argv]` (the Flower command line of `flower_command`) with `/metrics` behind Flower's auth."""
    if not require_auth_for_metrics():
        sys.stderr.write("chatq flower: this Flower serves /metrics without authentication; keep it on loopback\n")
    from celery.bin.celery import main

    sys.argv = ["celery", *argv]
    return main()


__all__ = ["cmd_flower", "flower_command", "require_auth_for_metrics", "run_celery_flower", "run_flower"]


if __name__ == "__main__":
    sys.exit(run_celery_flower(sys.argv[1:]))
