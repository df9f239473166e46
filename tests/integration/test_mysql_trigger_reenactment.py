"""``devkit/mysql_trigger.py``, the re-enactment of Azure's MySQL trigger that the benchmark and
docs/mysql-trigger.md rely on: its IDs, the state it creates, and what the extension's SQL does
on the real MariaDB with a failed call, a row failing five times, rows past ``LIMIT``, a row
stamped in a second already released and a late commit.

Each test works in a fresh database (``mysql_db``) and starts triggers of its own function names;
their leases tables and ``GlobalState`` rows are dropped afterwards (``az_func_mysql`` itself and
``GlobalState`` stay: other tests may share the server)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest

from azure_functions_db.errors import ConfigurationError
from devkit import dbservers
from devkit.mysql_trigger import (
    MySqlTrigger,
    Row,
    leases_table_name,
    user_function_id,
    user_table_id,
)

SITE = "afdb-tests"
MakeTrigger = Callable[..., MySqlTrigger]


def _connect(database: str) -> Any:
    return pymysql.connect(
        host=dbservers.MYSQL_HOST,
        port=dbservers.MYSQL_PORT,
        user=dbservers.MYSQL_USER,
        password="",
        database=database,
        autocommit=True,
        connect_timeout=dbservers.CONNECT_TIMEOUT,
    )


@pytest.fixture
def conn(mysql_db: str) -> Iterator[Any]:
    """A connection to a fresh database holding ``Products`` as the trigger's docs ask for it."""
    connection = _connect(mysql_db)
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE Products (ProductId int PRIMARY KEY, Name varchar(20), "
            "az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP)"
        )
    yield connection
    connection.close()


@pytest.fixture
def make_trigger(conn: Any) -> Iterator[MakeTrigger]:
    """Triggers on ``Products``, each of a function name of its own; their state dropped after."""
    made: list[MySqlTrigger] = []

    def make(**options: Any) -> MySqlTrigger:
        trigger = MySqlTrigger(
            conn, "Products", site=SITE, function=f"t_{uuid.uuid4().hex[:12]}", **options
        )
        made.append(trigger)
        trigger.start()
        return trigger

    yield make
    for trigger in made:
        trigger.drop_state()


def _next_second(conn: Any) -> None:
    """Wait until the server's clock is just past the start of a whole second."""
    with conn.cursor() as cur:
        cur.execute("SELECT UNIX_TIMESTAMP(NOW(6))")
        (now,) = cur.fetchone()
    time.sleep(1 - float(now) % 1 + 0.02)


def _insert(conn: Any, *pks: int) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO Products (ProductId, Name) VALUES (%s, 'x')", [(pk,) for pk in pks]
        )


def _stamp(conn: Any, pk: int) -> str:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT DATE_FORMAT(az_func_updated_at, '%%Y-%%m-%%d %%H:%%i:%%s') FROM Products "
            "WHERE ProductId = %s",
            (pk,),
        )
        (stamp,) = cur.fetchone()
    return str(stamp)


def _ok(rows: list[Row]) -> None:
    pass


def _fail(rows: list[Row]) -> None:
    raise RuntimeError("the function failed")


def _pks(rows: list[Row]) -> list[int]:
    return [int(row["ProductId"]) for row in rows]


def test_the_ids_are_the_extensions() -> None:
    # SHA-256 of the UTF-8 text, first 16 bytes as a .NET Guid (first three fields
    # little-endian), ToString("N"); the function's ID keeps 16 digits.
    assert user_function_id("mysite", "ProductsTrigger") == "f92fd06339e77528"
    assert user_table_id("testdb", "Products") == "2a0159833c84fb9f328bb03a18a3b574"
    assert leases_table_name("f92fd06339e77528", "2a0159833c84fb9f328bb03a18a3b574") == (
        "az_func_mysql.`Leases_f92fd06339e77528_2a0159833c84fb9f328bb03a18a3b574`"
    )
    with pytest.raises(ConfigurationError, match="WEBSITE_SITE_NAME"):
        user_function_id("", "ProductsTrigger")


@pytest.mark.mysql
def test_start_creates_the_extensions_state_and_skips_older_rows(
    conn: Any, mysql_db: str, make_trigger: MakeTrigger
) -> None:
    _insert(conn, 1)
    _next_second(conn)
    trigger = make_trigger()
    assert trigger.table_id == user_table_id(mysql_db, "Products")
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, LOWER(COLUMN_DEFAULT), "
            "COLUMN_KEY FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'az_func_mysql' "
            "AND TABLE_NAME IN ('GlobalState', %s) ORDER BY TABLE_NAME <> 'GlobalState', "
            "ORDINAL_POSITION",
            (f"Leases_{trigger.function_id}_{trigger.table_id}",),
        )
        columns = [row[1:] for row in cur.fetchall()]
        cur.execute("SELECT TIMESTAMPDIFF(SECOND, %s, NOW())", (trigger.last_polled_time(),))
        (since_start,) = cur.fetchone()
    assert columns == [
        ("UserFunctionID", "char(16)", "NO", None, "PRI"),
        ("UserTableID", "char(64)", "NO", None, "PRI"),
        ("LastPolledTime", "datetime", "NO", "current_timestamp()", ""),
        ("ProductId", "int(11)", "NO", None, "PRI"),
        ("_az_func_AttemptCount", "int(11)", "NO", None, ""),
        ("_az_func_LeaseExpirationTime", "datetime", "YES", "null", ""),
        ("_az_func_SyncCompletedTime", "datetime", "YES", "null", ""),
    ]
    assert 0 <= since_start <= 2  # LastPolledTime is the server's time at the first start

    # Row 1 was stamped before the start: never delivered. Row 2, stamped after it, is.
    _next_second(conn)
    _insert(conn, 2)
    assert _pks(trigger.poll(_ok).rows) == [2]
    # A second start (a host restart) keeps LastPolledTime: INSERT IGNORE.
    before = trigger.last_polled_time()
    trigger.start()
    assert trigger.last_polled_time() == before
    assert trigger.poll(_ok).rows == []


@pytest.mark.mysql
def test_a_failed_call_leaves_the_lease_until_it_expires(
    conn: Any, make_trigger: MakeTrigger
) -> None:
    trigger = make_trigger()  # the extension's 60 s lease
    before = trigger.last_polled_time()
    _next_second(conn)
    _insert(conn, 1)
    poll = trigger.poll(_fail)
    assert (_pks(poll.rows), poll.succeeded, poll.released) == ([1], False, False)
    [lease] = trigger.lease_rows()
    assert lease["_az_func_AttemptCount"] == 1
    assert lease["_az_func_SyncCompletedTime"] is None
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TIMESTAMPDIFF(SECOND, NOW(), %s)", (lease["_az_func_LeaseExpirationTime"],)
        )
        (left,) = cur.fetchone()
    assert 58 <= left <= 60
    assert trigger.poll(_ok).rows == []  # leased: not read again before it expires
    assert trigger.last_polled_time() == before


@pytest.mark.mysql
def test_a_row_failing_five_times_is_never_delivered_again(
    conn: Any, make_trigger: MakeTrigger
) -> None:
    # A 0 s lease expires as soon as the server's clock reaches the next second.
    trigger = make_trigger(lease_seconds=0)
    before = trigger.last_polled_time()
    _next_second(conn)
    _insert(conn, 1)
    attempts_seen = []
    for _ in range(5):
        poll = trigger.poll(_fail)
        assert _pks(poll.rows) == [1]
        attempts_seen.append(poll.rows[0]["_az_func_AttemptCount"])
        _next_second(conn)
    assert attempts_seen == [None, 1, 2, 3, 4]  # the count before each lease, as the function sees
    assert trigger.poll(_ok).rows == []
    with conn.cursor() as cur:
        cur.execute("UPDATE Products SET Name = 'y' WHERE ProductId = 1")
    _next_second(conn)
    assert trigger.poll(_ok).rows == []  # "ignored for all future changes"

    # The poisoned row still counts as unprocessed (AttemptCount between 1 and 5): a later row
    # is delivered, but LastPolledTime stays behind the poisoned one.
    _insert(conn, 2)
    poll = trigger.poll(_ok)
    assert (_pks(poll.rows), poll.released, poll.unprocessed) == ([2], True, 1)
    assert trigger.last_polled_time() == before
    assert [lease["ProductId"] for lease in trigger.lease_rows()] == [1, 2]  # none deleted
    assert trigger.poll(_ok).rows == []  # row 2's SyncCompletedTime hides it


@pytest.mark.mysql
def test_rows_past_the_batch_size_are_read_by_the_next_polls(
    conn: Any, make_trigger: MakeTrigger
) -> None:
    trigger = make_trigger(max_batch_size=2)
    _next_second(conn)
    _insert(conn, 5, 3, 1, 4, 2)  # one statement: one stamp
    stamp = _stamp(conn, 1)
    polls = [trigger.poll(_ok) for _ in range(4)]
    assert [_pks(p.rows) for p in polls] == [[1, 2], [3, 4], [5], []]
    assert [p.unprocessed for p in polls] == [3, 1, 0, None]  # LastPolledTime moves at the third
    assert trigger.last_polled_time() == stamp
    assert trigger.lease_rows() == []  # deleted with the move


@pytest.mark.mysql
def test_a_row_stamped_in_the_second_already_released_is_never_read(
    conn: Any, make_trigger: MakeTrigger
) -> None:
    trigger = make_trigger()
    for first in (1, 3, 5):  # the second may tick between the two inserts: then try again
        _next_second(conn)
        _insert(conn, first)
        poll = trigger.poll(_ok)
        assert (_pks(poll.rows), poll.unprocessed) == ([first], 0)
        assert trigger.last_polled_time() == _stamp(conn, first)
        _insert(conn, first + 1)  # committed at once, after the release
        if _stamp(conn, first + 1) != _stamp(conn, first):
            assert _pks(trigger.poll(_ok).rows) == [first + 1]
            continue
        # az_func_updated_at > LastPolledTime: the same second is not read again.
        assert trigger.poll(_ok).rows == []
        _next_second(conn)
        assert trigger.poll(_ok).rows == []
        return
    pytest.fail("the second ticked between two inserts three times")


@pytest.mark.mysql
def test_a_late_commit_stamped_before_a_released_batch_is_never_read(
    conn: Any, mysql_db: str, make_trigger: MakeTrigger
) -> None:
    trigger = make_trigger()
    _next_second(conn)
    writer = _connect(mysql_db)
    try:
        with writer.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO Products (ProductId, Name) VALUES (1, 'late')")
            _insert(conn, 2)  # committed at once, stamped in the same second or later
            assert _stamp(conn, 2) >= _stamp(writer, 1)
            poll = trigger.poll(_ok)
            assert (_pks(poll.rows), poll.unprocessed) == ([2], 0)
            cur.execute("COMMIT")
    finally:
        writer.close()
    assert trigger.last_polled_time() >= _stamp(conn, 1)
    assert trigger.poll(_ok).rows == []
    _next_second(conn)
    assert trigger.poll(_ok).rows == []
