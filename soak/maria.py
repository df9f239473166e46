"""The chaos soak on MariaDB: several pollers of one app on several tables of one server.

The same driver, faults and checker as the PostgreSQL soak (:mod:`soak.run`), on what a
MariaDB user runs: three pollers of one app (``soak.app``), one table each, two in the
low-latency mode and one as timer runs, each with two processes competing for its lease, all
reading ``information_schema.innodb_trx`` on one server at once. Tables have a string primary key
under the server's default case-insensitive collation and a naive ``DATETIME(6)`` cursor stamped
with ``NOW(6)`` in a zone that is not UTC (the writers' sessions; the pollers say so with
``cursor_timezone``); writers commit late, roll back, and span tables in one transaction. Each
poller writes through a ``SqlSink`` into MariaDB. Faults: the PostgreSQL soak's, with
``KILL CONNECTION`` for the database sessions (the pollers' and the writers' each have their own
user, which is how they are found).

Evidence: as the PostgreSQL soak's, with one folder per poller (``events/``, ``writers/`` (the
changes of that poller's table), ``samples.jsonl``, ``history.json``, ``sink.json``,
``quarantine.json``, ``meta.json``) beside the shared ``faults.jsonl`` and ``meta.json``, which
names the pollers (``poller_names``); :func:`soak.check.check` judges each folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import time
import urllib.parse
from typing import Any

import pymysql
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from azure_functions_db.sources.shards import expression_text
from devkit.evidence import read_events
from soak.run import REPO, Fault, Options, Poller, Soak, sharded

DEFAULT_MARIADB = "mysql://root@127.0.0.1:3306/test"
#: The writers' session zone (no daylight saving time) and the pollers' ``cursor_timezone``.
ZONE, ZONE_OFFSET = "Asia/Kolkata", "+05:30"


class MariaSoak(Soak):
    """The soak's driver over MariaDB (``python -m soak --db mariadb``)."""

    WRITER = "soak.maria_writer"
    DB = "mariadb"

    def __init__(self, options: Options, server: str = DEFAULT_MARIADB) -> None:
        if options.out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            out = REPO / ".afdb" / "soak" / f"{stamp}-seed{options.seed}-mariadb"
            options = dataclasses.replace(options, out=out)
        self.server = urllib.parse.urlsplit(server)
        super().__init__(options)
        self.poller_user, self.writer_user = f"soakp_{self.tag}", f"soakw_{self.tag}"

    def make_pollers(self) -> list[Poller]:
        """Three pollers, one table each, through a ``SqlSink`` into MariaDB (the timer one
        split over ``shards``)."""
        return [
            Poller("orders_ll", f"soak_{self.tag}_ll", "low", "sql"),
            Poller("orders_ll2", f"soak_{self.tag}_ll2", "low", "sql"),
            *sharded(Poller("orders_timer", f"soak_{self.tag}_tm", "timer", "sql"), self.o.shards),
        ]

    # -- setup ------------------------------------------------------------------------------

    @property
    def database(self) -> str:
        return self.server.path.lstrip("/") or "test"

    def maria(self) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            host=self.server.hostname or "127.0.0.1",
            port=self.server.port or 3306,
            user=self.server.username or "root",
            password=self.server.password or "",
            database=self.database,
            autocommit=True,
        )

    def create_tables(self) -> None:
        with self.maria() as conn, conn.cursor() as cur:
            for p in {p.table: p for p in self.pollers}.values():  # a table of shards once
                cur.execute(
                    f"CREATE TABLE `{p.table}` (id varchar(40) NOT NULL PRIMARY KEY, "
                    "version bigint NOT NULL, writer int NOT NULL, "
                    "updated_at datetime(6) NOT NULL, KEY (updated_at, id)) ENGINE=InnoDB"
                )
                cur.execute(
                    f"CREATE TABLE `{p.table}_history` (id varchar(40) NOT NULL, "
                    "version bigint NOT NULL, PRIMARY KEY (id, version)) ENGINE=InnoDB"
                )
                # One row per delivered version, no unique key: a batch applied twice shows as
                # duplicates, a lost one as missing.
                cur.execute(
                    f"CREATE TABLE `{p.table}_applied` (n bigint AUTO_INCREMENT PRIMARY KEY, "
                    "id varchar(40) NOT NULL, version bigint NOT NULL, fence bigint NOT NULL, "
                    "pid int NOT NULL) ENGINE=InnoDB"
                )
            for user in (self.poller_user, self.writer_user):
                cur.execute(f"CREATE USER '{user}'@'%%'")
                cur.execute(f"GRANT ALL ON `{self.database}`.* TO '{user}'@'%%'")
            # What the commit-safe horizon reads: information_schema.innodb_trx; and what lets
            # it see that the server has no trigger or stored function (its margin is then 0).
            cur.execute(f"GRANT PROCESS, TRIGGER ON *.* TO '{self.poller_user}'@'%%'")
            cur.execute(f"GRANT SELECT ON mysql.proc TO '{self.poller_user}'@'%%'")

    def drop_tables(self) -> None:
        with self.maria() as conn, conn.cursor() as cur:
            for p in self.pollers:
                for suffix in ("", "_history", "_applied", "_positions"):
                    cur.execute(f"DROP TABLE IF EXISTS `{p.table}{suffix}`")
            for user in (self.poller_user, self.writer_user):
                cur.execute(f"DROP USER IF EXISTS '{user}'@'%%'")

    def url(self, user: str, scheme: str) -> str:
        host = self.server.hostname or "127.0.0.1"
        return f"{scheme}://{user}@{host}:{self.server.port or 3306}/{self.database}"

    def env(self) -> dict[str, str]:
        env = super().env()
        poller_url = self.proxied(self.url(self.poller_user, "mysql+pymysql"))
        env.update(
            {
                "SOAK_DB_URL": poller_url,
                "SOAK_SINK_URL": poller_url,
                "SOAK_MARIA_WRITER_URL": self.url(self.writer_user, "mysql"),
                "SOAK_TABLES": ",".join(dict.fromkeys(p.table for p in self.pollers)),
                "SOAK_ZONE": ZONE,
                "SOAK_ZONE_OFFSET": ZONE_OFFSET,
                "SOAK_EVIDENCE": str(self.out / "writers"),
            }
        )
        return env

    def db_address(self) -> tuple[str, int]:
        return self.server.hostname or "127.0.0.1", self.server.port or 3306

    # -- faults -----------------------------------------------------------------------------

    def terminate(self, application: str) -> int:
        """``KILL CONNECTION`` of every session of the pollers, or of one writer."""
        user, _, index = application.rpartition("-writer-")
        with self.maria() as conn, conn.cursor() as cur:
            if user:  # one writer: its session
                cur.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s",
                    (self.writer_user,),
                )
                ids = [row[0] for row in cur.fetchall()]
                ids = [ids[int(index) % len(ids)]] if ids else []
            else:
                cur.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s",
                    (self.poller_user,),
                )
                ids = [row[0] for row in cur.fetchall()]
            for session in ids:
                with contextlib.suppress(pymysql.Error):
                    cur.execute(f"KILL CONNECTION {int(session)}")
        return len(ids)

    def inject(self, fault: Fault) -> None:
        if fault.kind == "terminate_pollers":
            self.record(fault.kind, sessions=self.terminate("pollers"))
        elif fault.kind == "terminate_writer":
            name = f"w-writer-{int(fault.draw * self.o.writers)}"
            self.record(fault.kind, application=name, sessions=self.terminate(name))
        else:
            super().inject(fault)

    # -- the run ----------------------------------------------------------------------------

    def rows_after(self, poller: Poller, position: list[Any] | None) -> int:
        """How many rows the database orders after ``position`` in ``poller``'s table, in its
        collation."""
        # A shard's own rows only.
        mine = f"{self.shard_expression(poller)} = {poller.shard}" if poller.shards > 1 else "1"
        with self.maria() as conn, conn.cursor() as cur:
            if position is None:
                cur.execute(f"SELECT COUNT(*) FROM `{poller.table}` WHERE {mine}")
            else:
                cursor = dt.datetime.fromisoformat(str(position[0]))
                cur.execute(
                    f"SELECT COUNT(*) FROM `{poller.table}` WHERE updated_at >= %s AND "
                    f"(updated_at > %s OR id > %s) AND {mine.replace('%', '%%')}",
                    (cursor, cursor, str(position[1])),
                )
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def shard_expression(self, poller: Poller) -> str:
        """The product's shard expression of ``poller``'s table (MariaDB, a string id)."""
        return expression_text(mysql.dialect(), [sa.Column("id", sa.String(40))], poller.shards)

    def shard_rows(self, poller: Poller) -> list[list[Any]] | None:
        query = f"SELECT id, {self.shard_expression(poller)} FROM `{poller.table}`"
        return self.maria_rows(query, poller)

    def dump_history(self) -> None:
        for p in self.pollers:
            rows = self.maria_rows(f"SELECT id, version FROM `{p.table}_history`", p)
            (self.out / p.name / "history.json").write_text(json.dumps(rows or []))
        self.split_writers()

    def split_writers(self) -> None:
        """Each poller's folder gets the writers' changes of its own table."""
        for path in sorted((self.out / "writers").glob("writer-*.jsonl")):
            events = list(read_events(path))
            for p in self.pollers:
                target = self.out / p.name / "writers" / path.name
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("w") as out:
                    for ev in events:
                        rows = [[r[1], r[2]] for r in ev.get("rows", []) if r[0] == p.table]
                        out.write(json.dumps({**ev, "rows": rows}) + "\n")

    def dump_sql_sink(self, poller: Poller) -> None:
        query = f"SELECT id, version, fence FROM `{poller.table}_applied` ORDER BY n"
        rows = self.maria_rows(query, poller)
        if rows is not None:
            (self.out / poller.name / "sink.json").write_text(json.dumps(rows))

    def maria_rows(self, query: str, poller: Poller) -> list[list[Any]] | None:
        try:
            with self.maria() as conn, conn.cursor() as cur:
                cur.execute(query)
                return [list(r) for r in cur.fetchall()]
        except pymysql.Error as exc:
            self.harness.append(f"{poller.name}: cannot read `{query}`: {exc}")
            return None
