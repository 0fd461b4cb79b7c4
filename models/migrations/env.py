"""Alembic environment: migrates the database of `DATABASE_URL` (or the URL the caller passes).

The edge of `alembic` run from a shell: what `models.migrate` did not hand in through the config's
attributes (the database, the default model a downgrade past 0005 writes) comes from the settings.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from chatq.settings import get_settings
from models.tables import Base

config = context.config
target_metadata = Base.metadata


_WANTED = ("database_url", "default_model")
if not all(config.attributes.get(name) for name in _WANTED):
    _settings = get_settings()
    for _name in _WANTED:
        config.attributes[_name] = config.attributes.get(_name) or getattr(_settings, _name)


def _url() -> str:
    url: str = config.attributes["database_url"]
    return url


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
