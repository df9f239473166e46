"""``afdb validate`` against real app files, on SQLite, PostgreSQL and MariaDB, with local state.

The source checks (table, columns, index, horizon, NULL cursors) run unchanged on each database;
the restricted-privilege fallbacks use a PostgreSQL role without ``pg_read_all_stats`` and a
MariaDB user without ``PROCESS``; the checkpoint checks use a checkpoint written by a real run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from azure_functions_db.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from azure_functions_db.errors import SourceError
from azure_functions_db.ops.validate import PollerValidation, validate_app
from azure_functions_db.sources import SqlSource
from devkit import dbservers

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
SECOND = dt.timedelta(seconds=1)

# -- databases and apps ---------------------------------------------------------------------------


@dataclass
class Db:
    """One database of the matrix: where the tables go and how the app reaches them."""

    kind: str  # sqlite | postgresql | mariadb
    url: str
    schema: str | None

    def qualified(self, table: str) -> str:
        return f"{self.schema}.{table}" if self.schema else table

    def create(
        self,
        table: str,
        *,
        index: bool = True,
        rows: int = 3,
        null_cursors: int = 0,
        database_clock: bool = False,
    ) -> None:
        """``table(id, note, updated_at)``; ``index`` adds one on (updated_at, id). Rows are
        stamped from T0 on, or with ``CURRENT_TIMESTAMP`` (``database_clock``); the first
        ``null_cursors`` rows have none."""
        md = sa.MetaData(schema=self.schema)
        stamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
        t = sa.Table(
            table,
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("note", sa.String(20)),
            sa.Column("updated_at", stamp, nullable=True),
        )
        if index:
            sa.Index(f"ix_{table}_keyset", t.c.updated_at, t.c.id)
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            md.create_all(engine)
            with engine.begin() as conn:
                for i in range(1, rows + 1):
                    stamp_at = sa.func.current_timestamp() if database_clock else T0 + i * SECOND
                    at = None if i <= null_cursors else stamp_at
                    conn.execute(t.insert().values(id=i, note=f"n{i}", updated_at=at))
        finally:
            engine.dispose()

    def run(self, sql: str) -> None:
        with dbservers.admin_engine(self.url) as engine, engine.begin() as conn:
            conn.exec_driver_sql(sql)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mysql),
    ]
)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    if request.param == "sqlite":
        return Db("sqlite", f"sqlite:///{tmp_path / 'validate.db'}", None)
    if request.param == "postgresql":
        return Db("postgresql", request.getfixturevalue("pg_url"), pg_schema_of(request))
    name = request.getfixturevalue("mysql_db")
    return Db("mariadb", dbservers.mysql_url(name), None)


def pg_schema_of(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_schema"))


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Db:
    return Db("sqlite", f"sqlite:///{tmp_path / 'validate.db'}", None)


@pytest.fixture
def pg(pg_url: str, pg_schema: str) -> Db:
    return Db("postgresql", pg_url, pg_schema)


@pytest.fixture
def maria(mysql_db: str) -> Db:
    return Db("mariadb", dbservers.mysql_url(mysql_db), None)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def poller(name: str, table: str, *, url: str = "%VAL_DB%", **options: Any) -> str:
    """The text of one ``@db.poller`` on ``table`` (cursor ``updated_at``, pk ``id``)."""
    options = {"cursor": "updated_at", "pk": "id", **options}
    args = "".join(f", {key}={value!r}" for key, value in options.items())
    function = "on_" + name.replace("-", "_")
    return (
        f"@db.poller(name={name!r}, schedule='0 0 * * * *',\n"
        f"           source=afdb.SqlSource(url={url!r}, table={table!r}{args}))\n"
        f"def {function}(batch):\n"
        f"    pass\n\n"
    )


def write_app(folder: Path, monkeypatch: pytest.MonkeyPatch, db: Db | None, *pollers: str) -> Path:
    """An app file with these pollers; ``%VAL_DB%`` is ``db``'s URL. A new file per content, so
    Python's bytecode cache never serves an older version of it."""
    text = "import azure_functions_db as afdb\n\ndb = afdb.PollerBlueprint()\n\n" + "".join(pollers)
    path = folder / f"app_{hashlib.sha1(text.encode()).hexdigest()[:10]}.py"
    path.write_text(text)
    if db is not None:
        monkeypatch.setenv("VAL_DB", db.url)
    return path


def validate_json(app: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["validate", str(app), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def validate_text(app: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["validate", str(app), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def findings(doc: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["check"] == check]


def level_of(doc: dict[str, Any], check: str) -> str:
    (finding,) = findings(doc, check)
    return str(finding["level"])


# -- the source checks, on every database -------------------------------------------------------

SAFE_METHOD = {
    "sqlite": "sqlite_clock",
    "postgresql": "pg_xact_start",
    "mariadb": "mysql_innodb_trx",
}
PRIVILEGES = {"sqlite": [], "postgresql": ["pg_read_all_stats"], "mariadb": ["PROCESS"]}


def test_clean_poller_exits_0_and_reports_the_horizon(db, tmp_path, monkeypatch, capsys):
    db.create("orders")
    app = write_app(tmp_path, monkeypatch, db, poller("orders", "orders", schema=db.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    assert [f for f in doc["findings"] if f["level"] != "ok"] == []
    assert doc["ok"] is True
    assert doc["horizon"] == {
        "method": SAFE_METHOD[db.kind],
        "detail": "",
        "privileges": PRIVILEGES[db.kind],
    }
    assert doc["index_ok"] is True
    assert doc["null_cursor_rows"] == 0
    assert doc["checkpoint"]["state"] == "absent"

    code, out = validate_text(app, capsys)
    assert code == EXIT_OK
    assert f"OK      horizon: Horizon `{SAFE_METHOD[db.kind]}`" in out
    assert "0 error(s), 0 warning(s)" in out


def test_missing_table_exits_1_naming_it(db, tmp_path, monkeypatch, capsys):
    db.create("orders")
    # The decorator's own check would stop the import on this table: validate defers it and
    # reports the poller instead.
    app = write_app(tmp_path, monkeypatch, db, poller("orders", "ordres", schema=db.schema))
    code, out = validate_text(app, capsys)
    assert code == EXIT_FAILED
    assert f"ERROR   source: Table `{db.qualified('ordres')}` does not exist" in out
    assert "`orders`" in out  # the tables that do exist are listed


def test_missing_column_exits_1_naming_it(db, tmp_path, monkeypatch, capsys):
    db.create("orders")
    app = write_app(
        tmp_path, monkeypatch, db, poller("orders", "orders", cursor="changed_at", schema=db.schema)
    )
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    (finding,) = findings(doc, "source")
    assert finding["level"] == "error"
    assert "Column `changed_at` (in `cursor=`) does not exist" in finding["message"]
    assert doc["horizon"] is None
    assert doc["index_ok"] is None


def test_no_supporting_index_is_a_warning_with_the_create_index(db, tmp_path, monkeypatch, capsys):
    db.create("plain", index=False)
    app = write_app(tmp_path, monkeypatch, db, poller("plain", "plain", schema=db.schema))
    code, out = validate_text(app, capsys)
    assert code == EXIT_OK
    table = db.qualified("plain")
    statement = f"CREATE INDEX ix_plain_keyset ON {table} (updated_at, id)"
    assert f"WARNING index: No index of `{table}` starts with (updated_at, id)" in out
    assert f"fix: {statement}" in out
    code, (doc,) = validate_json(app, capsys)
    assert (code, doc["index_ok"], doc["ok"]) == (EXIT_OK, False, True)
    (finding,) = findings(doc, "index")
    assert finding["fix"] == statement
    # SqlSource.check() reports the same missing index: validate shows it once.
    assert findings(doc, "source_check") == []


def test_null_cursors_are_counted(db, tmp_path, monkeypatch, capsys):
    db.create("orders", rows=5, null_cursors=2)
    app = write_app(tmp_path, monkeypatch, db, poller("orders", "orders", schema=db.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    assert doc["null_cursor_rows"] == 2
    (finding,) = findings(doc, "null_cursor")
    assert finding["level"] == "warning"
    assert "2 row(s)" in finding["message"]
    assert "`updated_at`" in finding["message"]


def test_null_cursors_are_an_error_when_the_source_raises_on_them(
    sqlite_db, tmp_path, monkeypatch, capsys
):
    sqlite_db.create("orders", rows=5, null_cursors=1)
    text = poller("orders", "orders", on_null_cursor="raise")
    code, (doc,) = validate_json(write_app(tmp_path, monkeypatch, sqlite_db, text), capsys)
    assert code == EXIT_FAILED
    assert doc["null_cursor_rows"] == 1
    assert level_of(doc, "null_cursor") == "error"


def test_sqlite_current_timestamp_text_is_accepted_and_mixed_formats_are_errors(
    sqlite_db, tmp_path, monkeypatch, capsys
):
    # CURRENT_TIMESTAMP text (no fraction) is one format the source binds back as stored: fine.
    sqlite_db.create("orders", database_clock=True)
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    assert findings(doc, "source_check") == []
    # A row in SQLAlchemy's format beside them: no bound can match both, so it is an error.
    engine = sa.create_engine(sqlite_db.url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO orders (id, note, updated_at) "
            "VALUES (9, 'x', '2026-01-01 12:00:00.000000')"
        )
    engine.dispose()
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    assert "several text formats" in json.dumps(doc)


# -- settings, state and the checkpoint (SQLite) ------------------------------------------------


def test_an_undefined_setting_is_an_error_naming_it(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    monkeypatch.delenv("VAL_NOT_SET", raising=False)
    text = poller("orders", "orders", url="%VAL_NOT_SET%")
    code, (doc,) = validate_json(write_app(tmp_path, monkeypatch, None, text), capsys)
    assert code == EXIT_FAILED
    (finding,) = findings(doc, "settings")
    assert finding["level"] == "error"
    assert "App setting `VAL_NOT_SET`" in finding["message"]


def test_a_schedule_setting_is_resolved_or_named(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    text = poller("orders", "orders").replace("'0 0 * * * *'", "'%VAL_SCHEDULE%'")
    app = write_app(tmp_path, monkeypatch, sqlite_db, text)
    monkeypatch.delenv("VAL_SCHEDULE", raising=False)
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    assert "`VAL_SCHEDULE`" in findings(doc, "settings")[0]["message"]
    monkeypatch.setenv("VAL_SCHEDULE", "*/30 * * * * *")
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    assert findings(doc, "schedule")[0]["message"] == (
        "Schedule `%VAL_SCHEDULE%` is `*/30 * * * * *`."
    )


def test_checkpoint_is_reported_and_nothing_is_written(
    sqlite_db, tmp_path, monkeypatch, capsys, state_dir
):
    sqlite_db.create("orders")
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    assert doc["checkpoint"]["state"] == "absent"
    assert not state_dir.exists()  # no lease taken, no record created

    assert main(["run", str(app), "--once"]) == EXIT_OK
    before = {p: p.read_bytes() for p in state_dir.rglob("*") if p.is_file()}
    assert any(p.name.endswith(".lease") for p in before)
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK
    after = {p: p.read_bytes() for p in state_dir.rglob("*") if p.is_file()}
    assert after == before
    checkpoint = doc["checkpoint"]
    assert (checkpoint["state"], checkpoint["fence"]) == ("present", 1)
    assert checkpoint["position"]["pk"] == [{"t": "int", "v": "3"}]
    assert checkpoint["source"]["cursor"] == ["updated_at"]
    assert doc["store"] == f"local:{state_dir}"


def test_changed_cursor_column_is_an_error_naming_afdb_seek(
    sqlite_db, tmp_path, monkeypatch, capsys
):
    sqlite_db.create("orders")
    first = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    assert main(["run", str(first), "--once"]) == EXIT_OK
    changed = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders", cursor="id"))
    code, (doc,) = validate_json(changed, capsys)
    assert code == EXIT_FAILED
    (finding,) = findings(doc, "source_change")
    assert finding["level"] == "error"
    assert "cursor ['updated_at']" in finding["message"]
    assert "cursor ['id']" in finding["message"]
    way_out = f"afdb seek {changed} --poller orders --beginning"
    assert way_out in finding["message"]
    assert finding["fix"] == way_out
    code, out = validate_text(changed, capsys)
    assert (code, "ERROR   source_change:" in out) == (EXIT_FAILED, True)

    # The way out it names works.
    assert main(["seek", str(changed), "--poller", "orders", "--beginning"]) == EXIT_OK
    code, (doc,) = validate_json(changed, capsys)
    assert code == EXIT_OK
    assert findings(doc, "source_change") == []


def test_changed_where_is_a_warning(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    first = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    assert main(["run", str(first), "--once"]) == EXIT_OK
    changed = write_app(
        tmp_path, monkeypatch, sqlite_db, poller("orders", "orders", where="note <> 'x'")
    )
    code, (doc,) = validate_json(changed, capsys)
    assert code == EXIT_OK
    (finding,) = findings(doc, "source_change")
    assert finding["level"] == "warning"
    assert "The `where` filter changed" in finding["message"]
    assert "not revisited" in finding["message"]


def test_an_unreadable_state_store_is_an_error(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("AFDB_STATE_DIR", str(blocker))
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    assert level_of(doc, "state") == "error"
    assert doc["checkpoint"]["state"] == "unknown"


# -- output, selection, Python API --------------------------------------------------------------


def test_json_structure_is_stable(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    code, docs = validate_json(app, capsys)
    assert code == EXIT_OK
    (doc,) = docs
    assert set(doc) == {
        "poller",
        "namespace",
        "ok",
        "errors",
        "warnings",
        "source",
        "store",
        "horizon",
        "index_ok",
        "null_cursor_rows",
        "checkpoint",
        "findings",
    }
    assert (doc["poller"], doc["namespace"], doc["errors"], doc["warnings"]) == (
        "orders",
        "live",
        0,
        0,
    )
    assert doc["source"] == {
        "table": "orders",
        "cursor": ["updated_at"],
        "pk": ["id"],
        "where": None,
        "columns": ["id", "note", "updated_at"],
    }
    assert set(doc["horizon"]) == {"method", "detail", "privileges"}
    assert set(doc["checkpoint"]) == {"state", "position", "position_text", "fence", "source"}
    assert [f["check"] for f in doc["findings"]] == [
        "source",
        "index",
        "horizon",
        "null_cursor",
        "checkpoint",
    ]
    for finding in doc["findings"]:
        assert set(finding) == {"check", "level", "message", "fix"}
        assert finding["level"] in ("ok", "warning", "error")


def test_poller_selection_and_an_unknown_poller(sqlite_db, tmp_path, monkeypatch, capsys):
    sqlite_db.create("orders")
    app = write_app(
        tmp_path,
        monkeypatch,
        sqlite_db,
        poller("good", "orders"),
        poller("broken", "no_such_table"),
    )
    code, docs = validate_json(app, capsys)
    assert (code, [d["poller"] for d in docs]) == (EXIT_FAILED, ["good", "broken"])
    code, docs = validate_json(app, capsys, "--poller", "good")
    assert (code, [d["poller"] for d in docs]) == (EXIT_OK, ["good"])
    code, out = validate_text(app, capsys, "--poller", "nope")
    assert code == EXIT_USAGE
    assert "Unknown poller `nope`" in out
    assert "broken, good" in out


def test_usable_from_python(sqlite_db, tmp_path, monkeypatch):
    sqlite_db.create("orders", index=False)
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("orders", "orders"))
    (result,) = validate_app(str(app))
    assert isinstance(result, PollerValidation)
    assert (result.ok, result.errors, result.warnings, result.index_ok) == (True, 0, 1, False)
    assert result.horizon is not None
    assert result.horizon.method == "sqlite_clock"
    assert [f.check for f in result.findings if f.level == "warning"] == ["index"]


# -- horizon fallbacks under restricted privileges ----------------------------------------------


@pytest.fixture
def pg_low_role(pg: Db) -> Iterator[str]:
    """A login role that may read the schema's tables but not other sessions' activity."""
    role = f"afdb_v_{uuid.uuid4().hex[:10]}"
    pg.run(f'CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA "{pg.schema}" TO {role}')
    yield role
    pg.run(f"DROP OWNED BY {role}; DROP ROLE {role}")


@pytest.mark.postgres
def test_pg_role_without_pg_read_all_stats_falls_back_naming_the_grant(
    pg, pg_low_role, tmp_path, monkeypatch, capsys
):
    pg.create("orders")
    pg.run(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg.schema}" TO {pg_low_role}')
    low = Db("postgresql", f"postgresql+psycopg://{pg_low_role}@127.0.0.1:5432/test", pg.schema)
    app = write_app(tmp_path, monkeypatch, low, poller("orders", "orders", schema=pg.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK  # a warning, not an error
    grant = f"GRANT pg_read_all_stats TO {pg_low_role}"
    assert doc["horizon"]["method"] == "none"
    assert grant in doc["horizon"]["detail"]
    (finding,) = findings(doc, "horizon")
    assert finding["level"] == "warning"
    assert grant in finding["message"]
    assert "late" in finding["message"]
    assert "can be missed" in finding["message"]
    assert finding["fix"] == grant
    # A date-time cursor takes a lag, so it stays on offer next to the grant.
    assert "set `lag=` longer than your longest write transaction" in finding["message"]

    # Granted, the same app gets the commit-safe method.
    pg.run(f"GRANT pg_read_all_stats TO {pg_low_role}")
    code, (doc,) = validate_json(app, capsys)
    assert (code, doc["horizon"]["method"], level_of(doc, "horizon")) == (
        EXIT_OK,
        "pg_xact_start",
        "ok",
    )


@pytest.fixture
def maria_low_user(maria: Db) -> Iterator[str]:
    """A user that may read the database's tables but lacks PROCESS."""
    user = f"afdb_v_{uuid.uuid4().hex[:10]}"
    database = sa.make_url(maria.url).database
    for host in ("%%", "localhost"):
        maria.run(f"CREATE USER '{user}'@'{host}'")
        maria.run(f"GRANT SELECT ON `{database}`.* TO '{user}'@'{host}'")
    yield user
    for host in ("%%", "localhost"):
        maria.run(f"DROP USER '{user}'@'{host}'")


@pytest.mark.mysql
def test_mariadb_user_without_process_falls_back_naming_the_grant(
    maria, maria_low_user, tmp_path, monkeypatch, capsys
):
    maria.create("orders")
    database = sa.make_url(maria.url).database
    low = Db("mariadb", f"mysql+pymysql://{maria_low_user}@127.0.0.1:3306/{database}", None)
    app = write_app(tmp_path, monkeypatch, low, poller("orders", "orders", lag=5))
    code, out = validate_text(app, capsys)
    grant = f"GRANT PROCESS ON *.* TO {maria_low_user}"
    assert code == EXIT_OK
    assert "WARNING horizon: Horizon `lag`:" in out
    assert grant in out
    assert "longer than the lag can be missed" in out
    code, (doc,) = validate_json(app, capsys)
    assert doc["horizon"]["method"] == "lag"
    assert doc["horizon"]["privileges"] == []
    assert findings(doc, "horizon")[0]["fix"] == grant


# -- cursor and key types a checkpoint cannot hold, and the lag advice ---------------------------


def create_keyed(db: Db, column_type: str, *values: str, table: str = "t") -> None:
    """``table(id int PRIMARY KEY, c <column_type>)`` with one row per SQL literal in ``values``."""
    db.run(f"CREATE TABLE {db.qualified(table)} (id int PRIMARY KEY, c {column_type})")
    for i, value in enumerate(values, start=1):
        db.run(f"INSERT INTO {db.qualified(table)} (id, c) VALUES ({i}, {value})")


def key_type_error(doc: dict[str, Any]) -> str:
    (finding,) = findings(doc, "key_types")
    assert finding["level"] == "error"
    return str(finding["message"])


# (column type, rows, what the message names). Without rows the type alone decides; with them
# the first row's key does (a type SQLAlchemy does not recognize, a value of another kind).
UNRECOGNIZED = pytest.mark.filterwarnings("ignore:Did not recognize type:sqlalchemy.exc.SAWarning")
PG_UNSTORABLE = [
    ("jsonb", (), "`JSONB`"),
    ("json", (), "`JSON`"),
    ("interval", (), "`INTERVAL`"),
    ("integer[]", (), "`INTEGER[]`"),
    ("int4range", (), "`INT4RANGE`"),
    ("timetz", (), "`TIME WITH TIME ZONE`"),
    pytest.param("point", ("'(1,2)'",), "type point", marks=UNRECOGNIZED),
    pytest.param("xml", ("'<a/>'",), "type xml", marks=UNRECOGNIZED),
    ("inet", ("'10.0.0.1'",), "IPv4Address"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(("column_type", "rows", "named"), PG_UNSTORABLE)
def test_pg_cursor_types_a_checkpoint_cannot_hold_are_errors(  # noqa: PLR0917
    pg, column_type, rows, named, tmp_path, monkeypatch, capsys
):
    create_keyed(pg, column_type, *rows)
    app = write_app(tmp_path, monkeypatch, pg, poller("t", "t", cursor="c", schema=pg.schema))
    code, (doc,) = validate_json(app, capsys)
    assert (code, doc["ok"]) == (EXIT_FAILED, False)
    message = key_type_error(doc)
    assert "`c`" in message
    assert named in message
    assert "Use a different cursor column, e.g. a `timestamptz` column" in message
    assert "`xid8`" in message
    # The horizon advice for such a cursor does not offer `lag=` (the source refuses it).
    assert "set `lag=`" not in findings(doc, "horizon")[0]["message"]
    code, out = validate_text(app, capsys)
    assert code == EXIT_FAILED
    assert "ERROR   key_types: " in out


@pytest.mark.postgres
def test_validate_fails_where_the_source_fails_on_a_jsonb_cursor(
    pg, opened, tmp_path, monkeypatch, capsys
):
    create_keyed(pg, "jsonb", """'{"a": 1}'""")
    source = SqlSource(pg.url, "t", cursor="c", pk="id", schema=pg.schema)
    opened.append(source)
    source.open({})  # the source opens: only a run finds out
    with pytest.raises(SourceError, match="checkpoint cannot hold"):
        source.fetch(None, 10, source.horizon())
    app = write_app(tmp_path, monkeypatch, pg, poller("t", "t", cursor="c", schema=pg.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    assert "Cursor column `c`" in key_type_error(doc)


@pytest.mark.postgres
def test_pg_key_column_a_checkpoint_cannot_hold_is_an_error(pg, tmp_path, monkeypatch, capsys):
    pg.create("orders")
    pg.run(f"ALTER TABLE {pg.qualified('orders')} ADD COLUMN tags text[]")
    text = poller("orders", "orders", pk="tags", schema=pg.schema)
    code, (doc,) = validate_json(write_app(tmp_path, monkeypatch, pg, text), capsys)
    assert code == EXIT_FAILED
    message = key_type_error(doc)
    assert "Key column `tags`" in message
    assert "`TEXT[]`" in message
    assert "`pk=`" in message


@pytest.mark.mysql
def test_mariadb_time_cursor_is_an_error(maria, tmp_path, monkeypatch, capsys):
    # MariaDB TIME is a duration up to 838:59:59, read back as a time of day: 30:00 as 06:00.
    create_keyed(maria, "TIME(6)")
    app = write_app(tmp_path, monkeypatch, maria, poller("t", "t", cursor="c"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    message = key_type_error(doc)
    assert "`c`" in message
    assert "`TIME(6)`" in message
    assert "30:00 as 06:00" in message
    assert "a `DATETIME(6)` column stamped with `NOW(6)`" in message


def test_a_cursor_value_that_does_not_find_its_row_again_is_an_error(
    sqlite_db, tmp_path, monkeypatch, capsys
):
    # SQLAlchemy reads a SQLite DECIMAL with 10 decimal places: 0.123456789012345 comes back as
    # 0.1234567890, which bound back matches no row, so every batch would read that row again.
    create_keyed(sqlite_db, "DECIMAL", "0.123456789012345", "0.5")
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("t", "t", cursor="c"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_FAILED
    message = key_type_error(doc)
    assert "Cursor column `c` of `t` (`DECIMAL`) does not find its row again" in message
    assert "0.1234567890" in message
    # Values read exactly find their row.
    create_keyed(sqlite_db, "DECIMAL", "0.5", "1.25", table="exact")
    app = write_app(tmp_path, monkeypatch, sqlite_db, poller("t", "exact", cursor="c"))
    code, (doc,) = validate_json(app, capsys)
    assert (code, findings(doc, "key_types")) == (EXIT_OK, [])


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mysql),
    ],
)
def test_single_precision_floats_find_their_row_again(request, kind, tmp_path, monkeypatch, capsys):
    # 0.1 in a float4 is not the double 0.1 the driver returns, but the source binds a position
    # cast to the column's type, and validate binds it the same way: no finding.
    db: Db = request.getfixturevalue("pg" if kind == "postgresql" else "maria")
    create_keyed(db, "real" if kind == "postgresql" else "FLOAT", "0.1", "0.2")
    app = write_app(tmp_path, monkeypatch, db, poller("t", "t", cursor="c", schema=db.schema))
    code, (doc,) = validate_json(app, capsys)
    assert (code, findings(doc, "key_types")) == (EXIT_OK, [])


NO_LAG_CURSORS = [
    pytest.param("postgresql", "text", "'a'", "`TEXT`", marks=pytest.mark.postgres),
    pytest.param("postgresql", "varchar(20)", "'a'", "`VARCHAR(20)`", marks=pytest.mark.postgres),
    pytest.param("postgresql", "bigint", "1", "`BIGINT`", marks=pytest.mark.postgres),
    pytest.param("mariadb", "JSON", """'{"a": 1}'""", "`LONGTEXT`", marks=pytest.mark.mysql),
    pytest.param("mariadb", "varchar(20)", "'a'", "`VARCHAR(20)`", marks=pytest.mark.mysql),
]


@pytest.mark.parametrize(("kind", "column_type", "value", "shown"), NO_LAG_CURSORS)
def test_horizon_advice_never_offers_a_lag_the_source_refuses(  # noqa: PLR0917
    request, kind, column_type, value, shown, tmp_path, monkeypatch, capsys
):
    db: Db = request.getfixturevalue("pg" if kind == "postgresql" else "maria")
    create_keyed(db, column_type, value)
    app = write_app(tmp_path, monkeypatch, db, poller("t", "t", cursor="c", schema=db.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK  # a text or integer cursor runs: only the horizon is a warning
    assert findings(doc, "key_types") == []
    assert doc["horizon"]["method"] == "none"
    (finding,) = findings(doc, "horizon")
    assert finding["level"] == "warning"
    assert "set `lag=`" not in finding["message"]
    assert "set `lag=`" not in doc["horizon"]["detail"]
    assert "`lag=` is no fix for this cursor" in finding["message"]
    assert f"`c` is {shown}" in finding["message"]
    fix = "`timestamptz`" if kind == "postgresql" else "`DATETIME(6)`"
    assert f"fix: stamp a {fix}" in finding["message"] or f"fix: use a {fix}" in finding["message"]

    # The same cursor chosen with `horizon="none"` on purpose: the same advice.
    text = poller("t", "t", cursor="c", schema=db.schema, horizon="none")
    code, (doc,) = validate_json(write_app(tmp_path, monkeypatch, db, text), capsys)
    (finding,) = findings(doc, "horizon")
    assert (code, finding["level"]) == (EXIT_OK, "warning")
    assert "set `lag=`" not in finding["message"]
    assert "`lag=` is no fix for this cursor" in finding["message"]

    # The advice is right: the source refuses `lag=` on this cursor.
    text = poller("t", "t", cursor="c", schema=db.schema, lag=5)
    code, (doc,) = validate_json(write_app(tmp_path, monkeypatch, db, text), capsys)
    assert code == EXIT_FAILED
    assert "needs a date or date-time cursor" in findings(doc, "source")[0]["message"]


# -- how the database compares the key ----------------------------------------------------------


@pytest.mark.mysql
def test_validate_reports_the_collation_of_text_keys_and_the_zones(
    maria, tmp_path, monkeypatch, capsys
):
    maria.run("CREATE TABLE t (id varchar(20) PRIMARY KEY, updated_at datetime(6) NOT NULL)")
    app = write_app(tmp_path, monkeypatch, maria, poller("t", "t"))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK, doc
    messages = [f["message"] for f in findings(doc, "key_order")]
    assert any("`id`" in m and "_ci`" in m for m in messages), messages  # case-insensitive
    assert any(
        "default zone is `SYSTEM" in m and "`cursor_timezone` is `UTC`" in m for m in messages
    )


@pytest.mark.postgres
def test_validate_reports_an_icu_collation(pg, tmp_path, monkeypatch, capsys):
    pg.run(
        f'CREATE TABLE {pg.qualified("t")} (id text COLLATE "en-x-icu" PRIMARY KEY, '
        "updated_at timestamptz NOT NULL)"
    )
    app = write_app(tmp_path, monkeypatch, pg, poller("t", "t", schema=pg.schema))
    code, (doc,) = validate_json(app, capsys)
    assert code == EXIT_OK, doc
    (finding,) = findings(doc, "key_order")
    assert "collation `en-x-icu (i)`" in finding["message"]
