"""Alembic environment: runs on the connection gpuyard hands it (see store.db.migrate)."""

from alembic import context

from gpuyard.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through gpuyard.store.db.migrate(engine)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
