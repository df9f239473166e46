"""docs/quickstart-postgres.md and docs/quickstart-mysql.md work as written, on the real servers.

Each page's SQL files run verbatim (in a fresh schema or database of their own; the role the
page grants to exists), its ``function_app.py`` is written as shown, and its commands run
through the real CLI with ``ORDERS_DB_URL`` pointed at the test server: the printed lines are
the page's, and a changed row comes again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pymysql
import pytest

from devkit import dbservers

DOCS = Path(__file__).resolve().parents[2] / "docs"
TITLED = re.compile(r'```(?:python|sql) title="([^"]+)"\n(.*?)```', re.DOTALL)
TEXT = re.compile(r"```text\n(.*?)```", re.DOTALL)


def afdb(folder: Path, url: str, *args: str) -> str:
    env = {**os.environ, "ORDERS_DB_URL": url, "AFDB_STATE_DIR": ".afdb/state"}
    env.pop("FUNCTIONS_WORKER_RUNTIME", None)
    done = subprocess.run(
        [sys.executable, "-m", "azure_functions_db", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def page(name: str, folder: Path) -> tuple[dict[str, str], list[str]]:
    text = (DOCS / name).read_text()
    files = dict(TITLED.findall(text))
    (folder / "function_app.py").write_text(files["function_app.py"])
    return files, TEXT.findall(text)


def follow(folder: Path, url: str, expected: list[str], change: callable) -> None:  # type: ignore[valid-type]
    afdb(folder, url, "validate", "function_app.py")
    first = afdb(folder, url, "run", "function_app.py", "--once")
    assert first.splitlines() == [line for line in expected[0].splitlines() if line.strip()]
    change()
    deadline = time.monotonic() + 30  # each run is a new interpreter: seconds when loaded
    while True:  # the horizon's settle margin: about a second
        again = afdb(folder, url, "run", "function_app.py", "--once")
        if "order 1: ada 11.00" in again or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "order 1: ada 11.00" in again, again


@pytest.mark.postgres
def test_the_postgresql_quickstart(pg_schema: str, tmp_path: Path) -> None:
    files, expected = page("quickstart-postgres.md", tmp_path)
    admin = psycopg.connect(dbservers.pg_url().replace("+psycopg", ""), autocommit=True)
    try:
        if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'orders_poller'").fetchone():
            admin.execute("CREATE ROLE orders_poller LOGIN")
        admin.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO orders_poller')
        admin.execute(f'SET search_path TO "{pg_schema}"')
        admin.execute(files["schema.sql"])  # verbatim
        url = (
            f"postgresql+psycopg://orders_poller:secret@{dbservers.PG_HOST}:{dbservers.PG_PORT}/"
            f"{dbservers.PG_DATABASE}?options=-csearch_path%3D{pg_schema}"
        )
        follow(tmp_path, url, expected, lambda: admin.execute(files["change.sql"]))
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
        admin.execute("REVOKE pg_read_all_stats FROM orders_poller")
        admin.close()


@pytest.mark.mysql
def test_the_mysql_quickstart(mysql_db: str, tmp_path: Path) -> None:
    files, expected = page("quickstart-mysql.md", tmp_path)
    admin = pymysql.connect(host="127.0.0.1", user="root", database=mysql_db, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'orders_poller'@'%' IDENTIFIED BY 'secret'")
            for statement in filter(str.strip, files["schema.sql"].split(";")):
                cur.execute(statement)  # verbatim, one statement at a time
        url = f"mysql+pymysql://orders_poller:secret@127.0.0.1:3306/{mysql_db}"

        def change() -> None:
            with admin.cursor() as cur:
                cur.execute(files["change.sql"].strip().rstrip(";"))

        follow(tmp_path, url, expected, change)
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS 'orders_poller'@'%'")
        admin.close()
