"""Schema migrations (Alembic) as plain functions: `chatq db upgrade` and the tests call these.

The caller (the CLI's entry, a test) names the database; nothing here reads the settings.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str | None = None, *, default_model: str | None = None) -> Config:
    """An Alembic config for chatq's migrations, optionally aimed at `database_url`.

    `default_model` is what a downgrade past 0005 writes into sessions that leave their model to
    the worker. Either one not given is read from the environment by the migrations' `env.py`, as
    for `alembic` run from a shell.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        config.attributes["database_url"] = database_url
    if default_model:
        config.attributes["default_model"] = default_model
    return config


def ensure_database(database_url: str) -> bool:
    """Create the database of `database_url` if it does not exist yet; True if it was created."""
    url = make_url(database_url)
    name = url.database
    if not name:
        return False
    engine = create_engine(url.set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}).first():
                return False
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.execute(text(f"CREATE DATABASE {quoted}"))
            return True
    finally:
        engine.dispose()


def upgrade(database_url: str, revision: str = "head", *, default_model: str | None = None) -> None:
    """Create the database if needed, then create or migrate the schema to `revision`."""
    ensure_database(database_url)
    command.upgrade(alembic_config(database_url, default_model=default_model), revision)


def downgrade(database_url: str, revision: str = "base", *, default_model: str | None = None) -> None:
    """Undo migrations down to `revision` (`default_model`: see `alembic_config`)."""
    command.downgrade(alembic_config(database_url, default_model=default_model), revision)
