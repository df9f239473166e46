"""One MariaDB soak writer process: ``python -m soak.maria_writer INDEX``.

Each transaction makes 1-8 row changes spread over the soak's tables (inserts of this writer's
new ids, updates of ids it inserted), each stamping ``updated_at = NOW(6)`` in the session's
zone (``SOAK_ZONE_OFFSET``, not UTC) and a ``version`` from this writer's counter, and records
each change in its table's history table in the same transaction. Ids are strings whose letters
order differently under the default case-insensitive collation than byte-wise (writer 0 writes
``a...``, writer 1 ``B...``): the database, not Python, must order them. Some transactions are
held open for seconds before COMMIT (late commits), some roll back. The evidence is
``soak.writer``'s, with the table of each change: ``rows`` are ``[table, id, version]``. With
``--burst ROWS`` it is the soak's burst (``soak.writer``), its ids ``Zb<n>-x``.

Environment: ``SOAK_MARIA_WRITER_URL`` (PyMySQL arguments as a URL), ``SOAK_TABLES``
(comma-separated), ``SOAK_ZONE_OFFSET``, ``SOAK_EVIDENCE``, ``SOAK_STOP``, ``SOAK_SEED``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pymysql

from devkit.evidence import EvidenceLog
from soak.writer import Ending, arguments, burst_keeps, run

LETTERS = "aBcDeFgH"


class MariaWriter:
    def __init__(self, index: int, env: Mapping[str, str]) -> None:
        self.index = index
        self.env = env
        self.tables = env["SOAK_TABLES"].split(",")
        self.log = EvidenceLog(Path(env["SOAK_EVIDENCE"]) / f"writer-{index}.jsonl")
        self.rng = random.Random(f"{env.get('SOAK_SEED', '0')}:maria-writer:{index}")  # noqa: S311
        self.owned: dict[str, list[str]] = {t: [] for t in self.tables}
        self.next_id = 0
        self.version = 0
        self.conn: pymysql.connections.Connection[Any] | None = None

    def connect(self) -> pymysql.connections.Connection[Any] | None:
        if self.conn is None or not self.conn.open:
            url = urllib.parse.urlsplit(self.env["SOAK_MARIA_WRITER_URL"])
            try:
                self.conn = pymysql.connect(
                    host=url.hostname or "127.0.0.1",
                    port=url.port or 3306,
                    user=url.username or "root",
                    password=url.password or "",
                    database=url.path.lstrip("/"),
                    autocommit=False,
                    connect_timeout=5,
                )
                with self.conn.cursor() as cur:
                    cur.execute("SET time_zone = %s", (self.env["SOAK_ZONE_OFFSET"],))
            except pymysql.Error as exc:
                self.log.write("connect_failed", error=type(exc).__name__)
                self.conn = None
                time.sleep(0.5)
        return self.conn

    def new_id(self) -> str:
        self.next_id += 1
        # Mixed case inside the id too: `a12-Xy`; unique per writer, so no two ids collide.
        return f"{LETTERS[self.index % len(LETTERS)]}{self.next_id}-{'XyZw'[self.next_id % 4]}"

    def transaction(self, conn: pymysql.connections.Connection[Any]) -> None:
        rng = self.rng
        changes: list[list[Any]] = []
        fresh: list[tuple[str, str]] = []
        try:
            with conn.cursor() as cur:
                for _ in range(rng.randint(1, 8)):
                    table = rng.choice(self.tables)
                    self.version += 1
                    owned = self.owned[table]
                    if owned and rng.random() < 0.6:
                        row = rng.choice(owned)
                        cur.execute(
                            f"UPDATE `{table}` SET version = %s, updated_at = NOW(6) WHERE id = %s",
                            (self.version, row),
                        )
                    else:
                        row = self.new_id()
                        cur.execute(
                            f"INSERT INTO `{table}` (id, version, writer, updated_at) "
                            "VALUES (%s, %s, %s, NOW(6))",
                            (row, self.version, self.index),
                        )
                        fresh.append((table, row))
                    cur.execute(
                        f"INSERT INTO `{table}_history` (id, version) VALUES (%s, %s)",
                        (row, self.version),
                    )
                    changes.append([table, row, self.version])
        except pymysql.Error as exc:
            self.log.write("aborted", rows=changes, error=type(exc).__name__)
            self.close()
            return
        if Ending(self.log, rng, changes, pymysql.Error, self.close).finish(
            conn.rollback, conn.commit
        ):
            for table, row in fresh:
                self.owned[table].append(row)

    def burst(self, conn: pymysql.connections.Connection[Any], count: int) -> int:
        """One burst transaction of ``count`` new rows over the tables; how many committed."""
        rows: list[tuple[str, str]] = []
        while len(rows) < count:
            self.next_id += 1
            row = f"Zb{self.next_id}-{'xY'[self.next_id % 2]}"
            if burst_keeps(row, self.next_id):
                rows.append((self.rng.choice(self.tables), row))
        changes = [[table, row, 1] for table, row in rows]
        try:
            with conn.cursor() as cur:
                for table in self.tables:
                    mine = [row for t, row in rows if t == table]
                    if not mine:
                        continue
                    cur.executemany(
                        f"INSERT INTO `{table}` (id, version, writer, updated_at) "
                        "VALUES (%s, 1, %s, NOW(6))",
                        [(row, self.index) for row in mine],
                    )
                    cur.executemany(
                        f"INSERT INTO `{table}_history` (id, version) VALUES (%s, 1)", mine
                    )
        except pymysql.Error as exc:
            self.log.write("aborted", rows=changes, error=type(exc).__name__)
            self.close()
            return 0
        ending = Ending(self.log, self.rng, changes, pymysql.Error, self.close)
        return count if ending.finish(conn.rollback, conn.commit) else 0

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(pymysql.Error):
                self.conn.close()
            self.conn = None


def main(argv: list[str]) -> int:
    index, burst = arguments(argv)
    return run(MariaWriter(index, os.environ), index, os.environ, burst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
