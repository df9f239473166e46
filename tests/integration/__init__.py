"""Integration tests against the real servers: PostgreSQL, MariaDB, SQLite, Azurite, Spark."""
