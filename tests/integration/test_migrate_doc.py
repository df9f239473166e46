"""docs/migrate-from-mysql-trigger.md works as written, on the real MariaDB: a table the MySQL
trigger's own SQL (re-enacted) has been delivering, with a row it gave up on; the page's
grants, given to a user `app` created for the test (the test fails rather than touch a user
`app` it did not create); its ``function_app.py`` and its ``afdb`` commands, run as they stand
in a fresh folder as that user; the statements the takeover prints drop the trigger's state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pymysql
import pytest

from devkit.mysql_trigger import MySqlTrigger, Row
from tests.support.source_kit import Db

pytestmark = [pytest.mark.mysql, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrate-from-mysql-trigger.md"
TITLED = re.compile(r'```python title="([^"]+)"\n(.*?)```', re.DOTALL)
SHELL = re.compile(r"```sh\n(.*?)```", re.DOTALL)
SQL = re.compile(r"```sql\n(.*?)```", re.DOTALL)
TEXT = re.compile(r"```text\n(.*?)```", re.DOTALL)


def _connect(db: Db) -> Any:
    url = urllib.parse.urlsplit(db.url.replace("mysql+pymysql://", "mysql://", 1))
    return pymysql.connect(
        host=url.hostname,
        port=url.port or 3306,
        user=url.username,
        database=url.path[1:],
        autocommit=True,
    )


def _run(command: str, cwd: Path, db: Db) -> str:
    assert command.startswith("afdb "), command
    as_app = db.url.replace("mysql+pymysql://root@", "mysql+pymysql://app@", 1)
    env = {**os.environ, "MYSQL_URL": as_app, "AFDB_STATE_DIR": ".afdb/state"}
    done = subprocess.run(
        [sys.executable, "-m", "azure_functions_db", *command.split()[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _shown(block: str) -> list[str]:
    """The lines the page shows, each up to its first ``...``."""
    return [line.split("...")[0] for line in block.splitlines() if line.strip()]


def _matches(output: str, block: str) -> None:
    lines = output.splitlines()
    for prefix in _shown(block):
        assert any(line.startswith(prefix) for line in lines), (prefix, output)


def test_the_migration_page_works_as_written(maria: Db, tmp_path: Path) -> None:
    text = DOC.read_text()
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE Products (ProductId int PRIMARY KEY, Name varchar(100), Cost int, "
            "az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE "
            "CURRENT_TIMESTAMP)"
        )
    conn = _connect(maria)
    trigger = MySqlTrigger(
        conn, "Products", site="contoso-shop", function="ProductsTrigger", lease_seconds=0
    )
    trigger.start()
    try:
        _follow(text, maria, trigger, tmp_path)
    finally:
        trigger.drop_state()
        conn.close()


def _follow(text: str, db: Db, trigger: MySqlTrigger, folder: Path) -> None:
    # The trigger's life before the switch: rows delivered, then one it gives up on.
    import time

    time.sleep(1.1)  # after its first LastPolledTime
    with trigger.conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO Products (ProductId, Name, Cost) VALUES (%s, %s, 1)",
            [(pk, f"p{pk}") for pk in range(1, 6)],
        )
    delivered: list[int] = []

    def function(rows: list[Row]) -> None:
        if any(row["Name"] == "bad" for row in rows):
            raise ValueError("the function fails on this row")
        delivered.extend(int(r["ProductId"]) for r in rows)

    trigger.poll(function)
    assert delivered == [1, 2, 3, 4, 5]
    time.sleep(1.1)
    with trigger.conn.cursor() as cur:
        cur.execute("INSERT INTO Products (ProductId, Name, Cost) VALUES (6, 'bad', 1)")
    for _ in range(5):  # leased and failed five times: given up for good
        assert trigger.poll(function).succeeded is False
        time.sleep(1.05)  # its lease (0 s here, whole seconds) has expired
    assert trigger.poll(function).rows == []

    # Step 2's grants, to the page's user.
    grants, drops = SQL.findall(text)
    with trigger.conn.cursor() as cur:
        cur.execute("CREATE USER 'app'@'%'")  # fails if there is one: never touch it
        try:
            for statement in filter(None, (g.strip() for g in grants.split(";"))):
                cur.execute(statement)
            _take_over_as_the_page_says(text, db, trigger, folder)
        finally:
            cur.execute("DROP USER 'app'@'%'")
    assert "DROP TABLE az_func_mysql.`Leases_<UserFunctionID>_<UserTableID>`;" in drops


def _take_over_as_the_page_says(text: str, db: Db, trigger: MySqlTrigger, folder: Path) -> None:
    # Step 1: the page's app, in a fresh folder.
    files = dict(TITLED.findall(text))
    assert list(files) == ["function_app.py"]
    (folder / "function_app.py").write_text(files["function_app.py"])
    # Step 2: validate says what it found.
    validated = _run("afdb validate function_app.py", folder, db)
    assert "Azure's MySQL trigger's column `az_func_updated_at`" in validated
    assert trigger.function_id in validated
    # Steps 4, 5, 6: the page's commands, in its order, against its shown output.
    dry_run, take_over, run = SHELL.findall(text)
    shown = TEXT.findall(text)
    planned = _run(dry_run.strip(), folder, db)
    _matches(planned, shown[0])
    assert "(6,) (5 attempts)" in planned
    assert "DROP TABLE az_func_mysql.`Leases_" in planned
    done = _run(take_over.strip(), folder, db)
    _matches(done, shown[1])
    ran = _run(run.strip(), folder, db)
    assert "6 row(s)" in ran, ran  # 1-5 again (the overlap) and 6, which the trigger gave up on
    # Step 7: the statements it printed drop the trigger's state for this function and table.
    statements = [
        line.strip()
        for line in done.splitlines()
        if line.strip().startswith(("DROP TABLE", "DELETE FROM"))
    ]
    assert len(statements) == 2
    with trigger.conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        cur.execute(
            "SELECT COUNT(*) FROM az_func_mysql.GlobalState WHERE UserFunctionID = %s",
            (trigger.function_id,),
        )
        assert cur.fetchone() == (0,)
