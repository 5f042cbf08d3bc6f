"""Persistence: SQLAlchemy Core tables, Alembic migrations, and the queries the services run."""
