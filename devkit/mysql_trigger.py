"""Azure's MySQL trigger, re-enacted on MariaDB/MySQL through PyMySQL: the state it keeps in the
user's server, its IDs, and one iteration of its change loop, run with its own SQL. The
benchmarks and the tests compare our poller with it (``docs/mysql-trigger.md``).

Re-enacted from ``Azure/azure-functions-mysql-extension`` at commit
a28494bf18e24191b42796fb00b035b457d9253d (2025-04-17), files under ``src/``:

- ``TriggersBinding/MySqlTriggerBinding.cs`` l.100-114: the UserFunctionID.
  ``TriggersBinding/MySqlTriggerUtils.cs`` l.28-60: the UserTableID; l.72-96: the primary key
  columns; l.105-109: the leases table's name. ``MySqlBindingUtilities.cs`` l.75-96: the checks
  of the user's table; l.201-215: backtick quoting.
- ``TriggersBinding/MySqlTriggerListener.cs`` l.101-127: the start, in one REPEATABLE READ
  transaction (the user's columns l.182-231, the database l.243, ``GlobalState`` l.284-290, its
  row l.319-320, the leases table l.349-356).
- ``TriggersBinding/MySqlTableChangeMonitor.cs``: one iteration of the change loop l.192-209;
  read the changes and acquire their leases in one transaction l.244-324 (SQL l.656-733); call
  the function l.326-378; release l.531-627 (SQL l.765-851) in one REPEATABLE READ transaction,
  tried up to 3 times.
- ``TriggersBinding/MySqlTriggerConstants.cs``: names and limits.

The SQL keeps the extension's text, its C# interpolations filled in the same way: names bare
where it leaves them bare and in backticks where it quotes them, primary key values inlined as
``'value'`` without escaping (so only ``int`` and ``str`` keys without quotes or backslashes are
accepted here). The read-and-lease transaction uses the session's isolation level (the extension
passes none; REPEATABLE READ is the server's default).

Not re-enacted: the lease renewal loop (``MySqlTableChangeMonitor.cs`` l.384-509, +15 s every
15 s while the function runs, the call cancelled after 10 renewals): here the handler runs inside
:meth:`MySqlTrigger.poll`, and one slower than the lease lets it lapse as an unrenewed lease
would. Nor reconnects, the polling delay (the caller's), the scaler, or a user-named leases table.
An error while reading changes propagates (the extension logs it and tries again after its
polling interval).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from azure_functions_db.ops.mysql_trigger_state import user_function_id, user_table_id

logger = logging.getLogger(__name__)

#: ``MySqlTriggerConstants.cs`` l.12-20 and l.28-32.
UPDATED_AT = "az_func_updated_at"
SCHEMA_NAME = "az_func_mysql"
GLOBAL_STATE = f"{SCHEMA_NAME}.GlobalState"
ATTEMPT_COUNT = "_az_func_AttemptCount"
LEASE_EXPIRATION_TIME = "_az_func_LeaseExpirationTime"
SYNC_COMPLETED_TIME = "_az_func_SyncCompletedTime"
RESERVED_COLUMN_NAMES = (ATTEMPT_COUNT, LEASE_EXPIRATION_TIME, SYNC_COMPLETED_TIME)
UNSUPPORTED_COLUMN_TYPES = frozenset(
    {"point", "multipoint", "linestring", "multilinestring", "polygon", "multipolygon",
     "geometry", "geometrycollection"}
)  # fmt: skip
#: ``MySqlTriggerConstants.cs`` l.37 and l.39: leases per row before it is skipped for good.
MAX_ATTEMPTS = 5
INITIAL_ATTEMPT_COUNT = 1
#: ``MySqlTableChangeMonitor.cs`` l.31 and l.33.
LEASE_SECONDS = 60
MAX_RETRY_RELEASE_LEASES = 3
#: ``Common/MySqlOptions.cs`` l.19-20: ``MySql_Trigger_MaxBatchSize`` and ``PollingIntervalMs``.
MAX_BATCH_SIZE = 100
POLLING_INTERVAL_MS = 1000

#: One row as the extension hands it to the function (a change's ``Item``): every user column,
#: ``az_func_updated_at`` as ``'YYYY-MM-DD HH:MM:SS'``, and the lease's attempt count and
#: expiration time from before this lease (``None`` on a first delivery).
Row = dict[str, Any]

#: The function: it succeeds by returning, fails by raising.
Handler = Callable[[list[Row]], None]


def _acute(name: str) -> str:
    """``AsAcuteQuotedString`` (``MySqlBindingUtilities.cs`` l.201-215)."""
    return "`" + name.replace("`", "``") + "`"


def leases_table_name(function_id: str, table_id: str) -> str:
    """``az_func_mysql.`Leases_<UserFunctionID>_<UserTableID>``` (``MySqlTriggerUtils.cs``
    l.105-109 with ``LeasesTableNameFormat``, ``MySqlTriggerConstants.cs`` l.28)."""
    return f"{SCHEMA_NAME}.`Leases_{function_id}_{table_id}`"


# -- The extension's SQL; {names} are its C# interpolations -------------------------------------

#: ``MySqlTriggerListener.cs`` l.243.
CREATE_SCHEMA = "CREATE DATABASE IF NOT EXISTS {schema};"

#: ``MySqlTriggerListener.cs`` l.284-290.
CREATE_GLOBAL_STATE = """
                    CREATE TABLE IF NOT EXISTS {global_state} (
                        UserFunctionID char(16) NOT NULL,
                        UserTableID char(64) NOT NULL,
                        LastPolledTime Datetime NOT NULL DEFAULT CURRENT_TIMESTAMP,
                        PRIMARY KEY (UserFunctionID, UserTableID)
                    );
            """

#: ``MySqlTriggerListener.cs`` l.319-320.
INSERT_GLOBAL_STATE_ROW = (
    "INSERT IGNORE INTO {global_state} (UserFunctionID, UserTableID)"
    " VALUES ('{function_id}', '{table_id}');"
)

#: ``MySqlTriggerListener.cs`` l.349-356.
CREATE_LEASES_TABLE = """
                    CREATE TABLE IF NOT EXISTS {leases} (
                        {primary_keys_with_types},
                        _az_func_AttemptCount int NOT NULL,
                        _az_func_LeaseExpirationTime datetime,
                        _az_func_SyncCompletedTime datetime,
                        PRIMARY KEY ({primary_keys})
                    );
            """

#: ``MySqlTriggerListener.cs`` l.185-191; an unqualified table's schema is ``SCHEMA()``.
GET_USER_TABLE_COLUMNS = """
                    SELECT COLUMN_NAME, DATA_TYPE
                    FROM INFORMATION_SCHEMA.COLUMNS
                    WHERE table_name = '{table}'
                    AND table_schema = SCHEMA()
                    AND column_name <> 'az_func_updated_at';
            """

#: ``MySqlTriggerUtils.cs`` l.75.
GET_PRIMARY_KEY_COLUMNS = "SHOW COLUMNS FROM {user_table} WHERE `Key` = 'PRI'"

#: ``MySqlBindingUtilities.cs`` l.77 and l.87.
VERIFY_TABLE_EXISTS = (
    "SELECT * FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
    "AND TABLE_NAME = '{table}'"
)
VERIFY_TABLE_SUPPORTED = (
    "SELECT * FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
    "AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'az_func_updated_at'"
)

#: ``MySqlTableChangeMonitor.cs`` l.663-689.
GET_CHANGES = """
                        SELECT {select_list}, 
                        DATE_FORMAT(u.az_func_updated_at, '%Y-%m-%d %H:%i:%s') AS az_func_updated_at,
                        l._az_func_AttemptCount,
                        l._az_func_LeaseExpirationTime
                        FROM {user_table} AS u
                        LEFT JOIN {leases} AS l ON {join}
                        WHERE 
                            (az_func_updated_at > (select LastPolledTime from {global_state} where UserFunctionID = '{function_id}' AND UserTableID = '{table_id}'))
                            AND
                            (   (l._az_func_LeaseExpirationTime IS NULL) 
                                OR
                                (l._az_func_LeaseExpirationTime < CURRENT_TIMESTAMP)
                            )
                            AND
                            (   (l._az_func_AttemptCount IS NULL)
                                OR 
                                (l._az_func_AttemptCount < {max_attempts})
                            )
                            AND
                            (   (l._az_func_SyncCompletedTime IS NULL)
                                OR 
                                (l._az_func_SyncCompletedTime < az_func_updated_at)
                            )
                        ORDER BY u.az_func_updated_at ASC, {primary_keys_asc}
                        LIMIT {max_batch_size};
                        """  # noqa: E501, W291

#: ``MySqlTableChangeMonitor.cs`` l.702-704 (one row's values) and l.722-729.
ACQUIRE_ROW_VALUES = (
    "( {pk_values}, {initial}, DATE_ADD(CURRENT_TIMESTAMP, INTERVAL {lease_seconds} SECOND) )"
)
ACQUIRE_LEASES = """ INSERT INTO {leases}
                                            ({primary_keys}, _az_func_AttemptCount, _az_func_LeaseExpirationTime)
                                        values
                                            {row_data}
                                        ON DUPLICATE KEY UPDATE
                                            _az_func_AttemptCount = _az_func_AttemptCount + 1,
                                            _az_func_LeaseExpirationTime = DATE_ADD(CURRENT_TIMESTAMP, INTERVAL {lease_seconds} SECOND)
                                        ;"""  # noqa: E501

#: ``MySqlTableChangeMonitor.cs`` l.767 (one row's condition) and l.771-778.
RELEASE_LEASES = """UPDATE {leases}
                                        SET
                                            _az_func_AttemptCount = 0,
                                            _az_func_LeaseExpirationTime = NULL,
                                            _az_func_SyncCompletedTime = CURRENT_TIMESTAMP
                                        WHERE
                                            {conditions}
                                        ;"""

#: ``MySqlTableChangeMonitor.cs`` l.795-814.
COUNT_UNPROCESSED = """
                        SELECT COUNT(*) 
                        FROM {user_table} AS u
                        LEFT JOIN {leases} AS l ON {join}
                        WHERE 
                            (az_func_updated_at > (select LastPolledTime from {global_state} where UserFunctionID = '{function_id}' AND UserTableID = '{table_id}'))
                            AND
                            (az_func_updated_at <= TIMESTAMP('{new_last_polled_time}'))
                            AND
                            (   (l._az_func_SyncCompletedTime IS NULL)
                                OR 
                                (l._az_func_SyncCompletedTime < az_func_updated_at)
                            )
                            AND
                            (   (l._az_func_AttemptCount IS NULL)
                                OR
                                (l._az_func_AttemptCount between {initial} and {max_attempts})
                            )
                            ;
                        """  # noqa: E501, W291

#: ``MySqlTableChangeMonitor.cs`` l.828-830.
UPDATE_LAST_POLLED_TIME = """UPDATE {global_state}
                        SET LastPolledTime = TIMESTAMP('{new_last_polled_time}')
                        where UserFunctionID = '{function_id}' AND UserTableID = '{table_id}';"""

#: ``MySqlTableChangeMonitor.cs`` l.844-848.
DELETE_PROCESSED = """DELETE FROM {leases} 
                        where   (_az_func_LeaseExpirationTime IS NULL 
                                 OR
                                 (_az_func_AttemptCount = 5 AND _az_func_LeaseExpirationTime < CURRENT_TIMESTAMP)
                                );"""  # noqa: E501, W291


def _literal(value: object) -> str:
    """A primary key value as the extension inlines it: ``'{value}'``, unescaped."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(
            f"primary key value `{value!r}` ({type(value).__name__}): the re-enactment inlines "
            "only int and str keys, as .NET would print them; use an int or str key."
        )
    text = str(value)
    if "'" in text or "\\" in text:
        raise ValueError(
            f"primary key value `{text}` has a quote or backslash, which the extension inlines "
            "unescaped (its SQL would break); use keys without them."
        )
    return f"'{text}'"


@dataclass(frozen=True)
class Poll:
    """What one iteration of the change loop did.

    Attributes:
        rows: The rows read and leased (handed to the function if any).
        succeeded: Whether the function returned; ``None`` when it was not called.
        released: Whether a release transaction committed in this iteration.
        unprocessed: The release's count of unprocessed rows up to the new last polled time
            (``None`` without a release); ``LastPolledTime`` moved only when it was 0.
    """

    rows: list[Row]
    succeeded: bool | None
    released: bool
    unprocessed: int | None


class MySqlTrigger:
    """One function's trigger on one table of the connection's database.

    :meth:`start` does what the extension's listener does when the host starts the function;
    each :meth:`poll` is one iteration of its change loop. The caller owns the PyMySQL
    connection (switched to autocommit, as the extension's driver runs outside transactions)
    and uses it from one thread at a time.

    Args:
        conn: A PyMySQL connection whose current database holds ``table``.
        table: The user's table, unqualified (a schema-qualified name fails the extension's own
            table check, ``MySqlBindingUtilities.cs`` l.77).
        site: ``WEBSITE_SITE_NAME``.
        function: The function's name.
        max_batch_size: ``MySql_Trigger_MaxBatchSize``.
        lease_seconds: The lease's length; the extension's is 60 s, tests may shorten it.
    """

    def __init__(
        self,
        conn: Any,
        table: str,
        *,
        site: str,
        function: str,
        max_batch_size: int = MAX_BATCH_SIZE,
        lease_seconds: int = LEASE_SECONDS,
    ) -> None:
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size `{max_batch_size}` must be a positive integer")
        if lease_seconds < 0:
            raise ValueError(f"lease_seconds `{lease_seconds}` must be 0 or more")
        self.conn = conn
        self.table = table
        self.function_id = user_function_id(site, function)
        self.max_batch_size = max_batch_size
        self.lease_seconds = lease_seconds
        self.table_id = ""
        self.leases = ""
        self._user_table = _acute(table)
        self._columns: list[str] = []
        self._pk: list[tuple[str, str]] = []
        self._rows_to_release: list[Row] = []

    # -- start --------------------------------------------------------------------------------

    def start(self) -> None:
        """Check the table, learn its columns and create the trigger's state if missing: the
        ``az_func_mysql`` database, ``GlobalState`` and this function's row in it (its
        ``LastPolledTime`` is the server's ``CURRENT_TIMESTAMP`` the first time; rows stamped
        at or before it are never delivered) and the leases table. Nothing is ever dropped by
        the extension; :meth:`drop_state` is for tests."""
        self.conn.autocommit(True)
        with self.conn.cursor() as cur:
            cur.execute("SELECT SCHEMA()")
            (database,) = cur.fetchone()
            if database is None:
                raise ValueError("the connection has no current database: connect to the table's")
            self.table_id = user_table_id(str(database), self.table)
            self._verify(cur)
            cur.execute(GET_PRIMARY_KEY_COLUMNS.format(user_table=self._user_table))
            self._pk = [(str(name), str(kind)) for name, kind, *_ in cur.fetchall()]
            if not self._pk:
                raise ValueError(f"table `{self.table}` has no primary key; the trigger needs one")
            self._columns = self._user_columns(cur)
            self.leases = leases_table_name(self.function_id, self.table_id)
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION")
            cur.execute(CREATE_SCHEMA.format(schema=SCHEMA_NAME))
            cur.execute(CREATE_GLOBAL_STATE.format(global_state=GLOBAL_STATE))
            cur.execute(INSERT_GLOBAL_STATE_ROW.format(**self._names()))
            cur.execute(
                CREATE_LEASES_TABLE.format(
                    leases=self.leases,
                    primary_keys_with_types=", ".join(f"{n} {t}" for n, t in self._pk),
                    primary_keys=", ".join(n for n, _ in self._pk),
                )
            )
            cur.execute("COMMIT")

    def _verify(self, cur: Any) -> None:
        cur.execute(VERIFY_TABLE_EXISTS.format(table=self.table))
        if cur.fetchone() is None:
            raise ValueError(f"table `{self.table}` is not in the connection's database")
        cur.execute(VERIFY_TABLE_SUPPORTED.format(table=self.table))
        if cur.fetchone() is None:
            raise ValueError(
                f"table `{self.table}` has no `{UPDATED_AT}` column; add it with `ALTER TABLE "
                f"{self.table} ADD COLUMN {UPDATED_AT} TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON "
                "UPDATE CURRENT_TIMESTAMP`"
            )

    def _user_columns(self, cur: Any) -> list[str]:
        cur.execute(GET_USER_TABLE_COLUMNS.format(table=self.table))
        found = [(str(name), str(kind)) for name, kind in cur.fetchall()]
        unsupported = [f"{name} ({kind})" for name, kind in found
                       if kind in UNSUPPORTED_COLUMN_TYPES]  # fmt: skip
        reserved = [name for name, _ in found if name in RESERVED_COLUMN_NAMES]
        if unsupported or reserved:
            raise ValueError(
                f"table `{self.table}`: the trigger rejects columns of unsupported types "
                f"{unsupported} and reserved names {reserved}"
            )
        return [name for name, _ in found]

    def drop_state(self) -> None:
        """Drop this function's leases table and delete its ``GlobalState`` row (the database and
        ``GlobalState`` itself stay: other functions may use them)."""
        if not self.leases:
            return
        with self.conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {self.leases}")
            cur.execute(
                f"DELETE FROM {GLOBAL_STATE} WHERE UserFunctionID = %s AND UserTableID = %s",
                (self.function_id, self.table_id),
            )

    # -- one iteration of the change loop -----------------------------------------------------

    def poll(self, handler: Handler) -> Poll:
        """Read and lease up to ``max_batch_size`` changed rows (one transaction); if any, call
        ``handler`` with them; then, as in the extension's cleanup state, release the rows of
        the last successful call that are not yet released."""
        if not self._pk:
            raise RuntimeError("call start() before poll()")
        rows = self._get_changes()
        if not rows:
            return Poll(rows=[], succeeded=None, released=False, unprocessed=None)
        try:
            handler([dict(row) for row in rows])
        except Exception as exc:  # the host's TryExecuteAsync: any exception is a failed call
            logger.info("action=call_failed function=%s error=%r", self.function_id, exc)
            succeeded = False
        else:
            succeeded = True
            self._rows_to_release = rows
        released, unprocessed = self._release_leases()
        return Poll(rows=rows, succeeded=succeeded, released=released, unprocessed=unprocessed)

    def _names(self) -> dict[str, str]:
        return {
            "global_state": GLOBAL_STATE,
            "function_id": self.function_id,
            "table_id": self.table_id,
        }

    def _join(self) -> str:
        return " AND ".join(f"u.{_acute(n)} = l.{_acute(n)}" for n, _ in self._pk)

    def _pk_values(self, row: Row) -> str:
        # The row's primary key columns in the row's (select list) order, as l.703 takes them.
        names = {n for n, _ in self._pk}
        return ", ".join(_literal(v) for k, v in row.items() if k in names)

    def _match_conditions(self, rows: Sequence[Row]) -> str:
        names = {n for n, _ in self._pk}
        return " OR ".join(
            "( " + " AND ".join(f"{k} = {_literal(v)}" for k, v in row.items() if k in names) + " )"
            for row in rows
        )

    def _get_changes(self) -> list[Row]:
        sql = GET_CHANGES.format(
            select_list=", ".join(f"u.{_acute(c)}" for c in self._columns),
            user_table=self._user_table,
            leases=self.leases,
            join=self._join(),
            max_attempts=MAX_ATTEMPTS,
            primary_keys_asc="ASC , ".join(n for n, _ in self._pk),
            max_batch_size=self.max_batch_size,
            **self._names(),
        )
        with self.conn.cursor() as cur:
            cur.execute("START TRANSACTION")
            try:
                cur.execute(sql)  # no arguments: PyMySQL leaves the % signs alone
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
                if rows:
                    cur.execute(
                        ACQUIRE_LEASES.format(
                            leases=self.leases,
                            primary_keys=", ".join(n for n, _ in self._pk),
                            row_data=", ".join(
                                ACQUIRE_ROW_VALUES.format(
                                    pk_values=self._pk_values(row),
                                    initial=INITIAL_ATTEMPT_COUNT,
                                    lease_seconds=self.lease_seconds,
                                )
                                for row in rows
                            ),
                            lease_seconds=self.lease_seconds,
                        )
                    )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        return rows

    def _release_leases(self) -> tuple[bool, int | None]:
        """``ReleaseLeasesAsync``: on a failure the transaction is rolled back and tried again,
        3 times in all; after that the rows stay to be released after the next call."""
        if not self._rows_to_release:
            return False, None
        # RecomputeLastPolledTime (l.531-546): the ordinal maximum of the formatted stamps.
        new_last_polled_time = max(str(row[UPDATED_AT]) for row in self._rows_to_release)
        for attempt in range(1, MAX_RETRY_RELEASE_LEASES + 1):
            try:
                unprocessed = self._release_transaction(new_last_polled_time)
            except pymysql.MySQLError as exc:
                logger.warning(
                    "action=release_failed function=%s attempt=%s error=%r",
                    self.function_id, attempt, exc,
                )  # fmt: skip
                continue
            self._rows_to_release = []
            return True, unprocessed
        return False, None

    def _release_transaction(self, new_last_polled_time: str) -> int:
        names = {**self._names(), "new_last_polled_time": new_last_polled_time}
        with self.conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION")
            try:
                cur.execute(
                    RELEASE_LEASES.format(
                        leases=self.leases,
                        conditions=self._match_conditions(self._rows_to_release),
                    )
                )
                cur.execute(
                    COUNT_UNPROCESSED.format(
                        user_table=self._user_table,
                        leases=self.leases,
                        join=self._join(),
                        initial=INITIAL_ATTEMPT_COUNT,
                        max_attempts=MAX_ATTEMPTS,
                        **names,
                    )
                )
                (unprocessed,) = cur.fetchone()
                if unprocessed == 0:
                    cur.execute(UPDATE_LAST_POLLED_TIME.format(**names))
                    cur.execute(DELETE_PROCESSED.format(leases=self.leases))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        return int(unprocessed)

    # -- reading the state back (tests) -------------------------------------------------------

    def last_polled_time(self) -> str:
        """``GlobalState.LastPolledTime`` of this function and table, ``'YYYY-MM-DD HH:MM:SS'``."""
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT DATE_FORMAT(LastPolledTime, '%%Y-%%m-%%d %%H:%%i:%%s') FROM {GLOBAL_STATE}"
                " WHERE UserFunctionID = %s AND UserTableID = %s",
                (self.function_id, self.table_id),
            )
            (value,) = cur.fetchone()
        return str(value)

    def lease_rows(self) -> list[Row]:
        """The leases table's rows, in primary key order."""
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {self.leases} ORDER BY {', '.join(n for n, _ in self._pk)}")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
