"""The pyodbc code path against the ODBC drivers that exist here (tests only).

SQL Server's driver, pyodbc, cannot meet a SQL Server here (none can be installed), but it can
meet the PostgreSQL and MariaDB test servers through their Debian ODBC drivers
(``odbc-postgresql`` = psqlODBC, ``odbc-mariadb`` = MariaDB Connector/ODBC, installed by
``.ci/run``). ``tests/integration/test_pyodbc_path.py`` runs ``SqlSource`` through them.

* MariaDB: SQLAlchemy's own ``mysql+pyodbc`` dialect, unchanged.
* PostgreSQL: SQLAlchemy has no pyodbc dialect, so :class:`PGDialectPyodbc` is a test-only one,
  SQLAlchemy's ``PyODBCConnector`` (what ``mssql+pyodbc`` is built on) plus its ``PGDialect``,
  registered as ``postgresql+pyodbc`` by :func:`register`. It is *not* part of the package and
  not a supported way to reach PostgreSQL (use ``postgresql+psycopg``). Three things psqlODBC
  needs, each set here and nowhere else:

  - the port as ``Port=`` (``PyODBCConnector`` writes ``Server=host,port``, SQL Server's form);
  - ``UseServerSidePrepare=0``: with server-side prepare the server must infer the type of every
    ``?``, and SQLAlchemy's catalog queries have untyped ones (``json_build_object(?, ...)``);
    ``BoolsAsChar=0``: otherwise booleans arrive as the text ``'0'``/``'1'`` (and ``'0'`` is
    true in Python);
  - arrays arrive as PostgreSQL's text form (``{id,updated_at}``); catalog reflection
    (primary keys, indexes) aggregates into arrays, so :class:`TextArray` parses that form.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.connectors.pyodbc import PyODBCConnector
from sqlalchemy.dialects import postgresql, registry
from sqlalchemy.dialects.postgresql.base import PGDialect

from devkit import dbservers

#: Driver names as Debian's packages write them into /etc/odbcinst.ini.
PG_DRIVER = "PostgreSQL Unicode"
MARIADB_DRIVER = "MariaDB Unicode"

_PSQLODBC_DEFAULTS = {"BoolsAsChar": "0", "UseServerSidePrepare": "0"}
_ARRAY_ITEM = re.compile(r'"((?:[^"\\]|\\.)*)"|([^,{}]+)')


def parse_text_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array in its text form, e.g. ``{a,"b c",NULL}``.

    ``int2vector`` and ``oidvector`` (``pg_index.indkey``, ``indoption``, ``indclass``) come as
    space-separated numbers, ``0 3``.
    """
    if not (text.startswith("{") and text.endswith("}")):
        if re.fullmatch(r"-?\d+( -?\d+)*|", text) is None:
            raise ValueError(f"not a PostgreSQL array or vector: {text!r}")
        return list(text.split())
    items: list[str | None] = []
    for quoted, bare in _ARRAY_ITEM.findall(text[1:-1]):
        if bare:
            items.append(None if bare == "NULL" else bare)
        else:
            items.append(re.sub(r"\\(.)", r"\1", quoted))
    return items


class TextArray(postgresql.ARRAY):  # type: ignore[type-arg]
    """``ARRAY`` read from psqlODBC's text form; items typed by the array's item type."""

    cache_ok = True

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> Callable[[Any], Any]:
        items: Callable[[str], Any]
        try:
            python_type: type = self.item_type.python_type
        except NotImplementedError:  # OID, REGCLASS: numbers in the catalog
            python_type = int
        if python_type is bool:
            items = lambda item: item == "t"  # noqa: E731
        elif python_type is int:
            items = int
        else:
            items = str
        process_list = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if isinstance(value, str):
                value = [None if i is None else items(i) for i in parse_text_array(value)]
            return process_list(value) if process_list else value

        return process


class PGDialectPyodbc(PyODBCConnector, PGDialect):
    """``postgresql+pyodbc``: SQLAlchemy's PostgreSQL dialect over pyodbc and psqlODBC."""

    name = "postgresql"
    driver = "pyodbc"
    supports_statement_cache = True
    pyodbc_driver_name = PG_DRIVER
    colspecs: ClassVar[dict[Any, Any]] = {  # type: ignore[misc]
        **PGDialect.colspecs,
        sa.ARRAY: TextArray,
        postgresql.ARRAY: TextArray,
    }

    def create_connect_args(self, url: sa.URL) -> Any:
        if "odbc_connect" not in url.query:
            if url.port is not None:
                url = url.set(port=None).update_query_dict({"Port": str(url.port)})
            missing = {k: v for k, v in _PSQLODBC_DEFAULTS.items() if k not in url.query}
            url = url.update_query_dict(missing)
        return super().create_connect_args(url)

    def _get_server_version_info(self, connection: sa.Connection) -> Any:
        # PostgreSQL's own `SELECT version()` parsing, not ODBC's SQL_DBMS_VER.
        return PGDialect._get_server_version_info(self, connection)  # type: ignore[no-untyped-call]


def register() -> None:
    """Make ``postgresql+pyodbc`` URLs load :class:`PGDialectPyodbc` (idempotent)."""
    registry.register("postgresql.pyodbc", __name__, "PGDialectPyodbc")


def pg_odbc_url(*, port: int = dbservers.PG_PORT, password: str | None = None) -> str:
    """``postgresql+pyodbc://postgres@127.0.0.1:5432/test?driver=PostgreSQL+Unicode``."""
    auth = dbservers.PG_USER + (f":{urllib.parse.quote_plus(password)}" if password else "")
    return (
        f"postgresql+pyodbc://{auth}@{dbservers.PG_HOST}:{port}/{dbservers.PG_DATABASE}"
        f"?driver={urllib.parse.quote_plus(PG_DRIVER)}"
    )


def mysql_odbc_url(
    database: str = dbservers.MYSQL_DATABASE,
    *,
    port: int = dbservers.MYSQL_PORT,
    password: str | None = None,
) -> str:
    """``mysql+pyodbc://root@127.0.0.1/<database>?driver=MariaDB+Unicode&port=3306``.

    The port goes in the query: ``PyODBCConnector`` would write ``Server=host,port``, which the
    MariaDB driver does not read; a ``port`` query parameter becomes ``port=3306``.
    """
    auth = dbservers.MYSQL_USER + (f":{urllib.parse.quote_plus(password)}" if password else "")
    return (
        f"mysql+pyodbc://{auth}@{dbservers.MYSQL_HOST}/{database}"
        f"?driver={urllib.parse.quote_plus(MARIADB_DRIVER)}&port={port}"
    )


def odbc_connect_url(dialect: str, attributes: Sequence[tuple[str, str]]) -> str:
    """``<dialect>+pyodbc:///?odbc_connect=<URL-encoded ODBC connection string>``."""
    text = ";".join(f"{key}={value}" for key, value in attributes)
    return f"{dialect}+pyodbc:///?odbc_connect={urllib.parse.quote_plus(text)}"


def installed_drivers() -> list[str]:
    """The ODBC drivers unixODBC knows (empty when pyodbc or unixODBC is missing)."""
    try:
        import pyodbc  # type: ignore[import-not-found]
    except ImportError:
        return []
    return list(pyodbc.drivers())
