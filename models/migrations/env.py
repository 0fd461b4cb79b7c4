"""Alembic environment: migrates the database of `DATABASE_URL` (or the URL the caller passes)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from chatq.settings import get_settings
from models.tables import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.attributes.get("database_url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            # Two `chatq db upgrade` at once (compose's migrate + a developer) must not race.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(774411)")
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
