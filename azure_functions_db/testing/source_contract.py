"""The contract suite of :class:`~azure_functions_db.core.ports.Source`: one suite, every adapter.

Every source must pass :class:`SourceContract` unchanged, the in-memory fake included. The suite
never orders keys in Python: it asks the adapter for the database's own order
(:meth:`SourceContract.ordered`), so a case-insensitive collation, an ICU collation or a UUID
type that orders unlike Python is judged by the database's rules. To run it over an adapter,
subclass it in a test module (pytest collects the subclass, not this base) and implement the
hooks; :class:`SqlSourceContract` implements them for any SQLAlchemy URL::

    class TestMyDatabase(SqlSourceContract):
        type_cases = (TypeCase("int", "INTEGER", ("1", "2", "3")),)

        @pytest.fixture
        def scratch(self) -> Iterator[Scratch]:
            yield Scratch(url="mydb://...", schema="scratch")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Change
from azure_functions_db.core.checkpoint import (
    Checkpoint,
    PollerKey,
    decode_checkpoint,
    encode_checkpoint,
)
from azure_functions_db.core.ports import Horizon, Source, SourceRow
from azure_functions_db.core.position import Position
from azure_functions_db.core.reader import ReadAheadSource
from azure_functions_db.errors import NullCursorError, SourceDefinitionError

__all__ = ["Literal", "Scratch", "SourceContract", "SqlSourceContract", "TypeCase", "drain"]

NO_HORIZON = Horizon(bound=None, method="none")
KEY = PollerKey("live", "contract")


class Literal(str):
    """A value a SQL adapter writes as SQL text (``'2026-01-01'``, ``x'00ff'``), so it is stored
    the way users store it; other adapters take the Python value of the case instead."""

    __slots__ = ()


@dataclass(frozen=True)
class TypeCase:
    """One key type an adapter accepts: how the adapter spells the type, and three distinct
    values (in any order: the database decides theirs)."""

    id: str
    type: str
    values: tuple[Any, ...]


def drain(
    source: Source, batch: int, after: Position | None = None, horizon: Horizon = NO_HORIZON
) -> list[SourceRow]:
    """Read everything the way the engine does: each batch starts after the last position
    (which went through a checkpoint record and back), with a guard against a stuck bound."""
    out: list[SourceRow] = []
    for _ in range(10_000):
        rows = source.fetch(after, batch, horizon)
        assert len(rows) <= batch
        if not rows:
            return out
        out.extend(rows)
        after = through_checkpoint(source, rows[-1].position)
    raise AssertionError("the source never ran dry: a bound re-reads its own row")


def through_checkpoint(source: Source, position: Position) -> Position:
    """``position`` stored in a checkpoint record and read back, as every state store does."""
    record = Checkpoint(key=KEY, position=position, fence=1, source=source.description)
    decoded = decode_checkpoint(encode_checkpoint(record)).position
    assert decoded is not None
    return decoded


def _pk(rows: Sequence[SourceRow]) -> list[tuple[Any, ...]]:
    return [tuple(row.position.pk) for row in rows]


class SourceContract:
    """The contract of :class:`~azure_functions_db.core.ports.Source`, run over one adapter."""

    #: Key types this adapter accepts, each drained as a cursor and as a primary key.
    type_cases: ClassVar[Sequence[TypeCase]] = ()
    #: How this adapter spells an integer and a short text column.
    int_type: ClassVar[str] = "int"
    text_type: ClassVar[str] = "text"

    # -- hooks -------------------------------------------------------------------------------

    def create(
        self,
        table: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        """Create ``table`` with ``columns`` (name -> type as this adapter spells it; ``?`` at
        the end: nullable), primary key ``key``, holding ``rows``."""
        raise NotImplementedError

    def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add ``rows`` to ``table``."""
        raise NotImplementedError

    def source(
        self, table: str, cursor: Sequence[str], pk: Sequence[str], **options: Any
    ) -> Source:
        """An open source over ``table`` (``options``: ``on_null_cursor``); closed after the
        test by :meth:`close_all`."""
        raise NotImplementedError

    def ordered(
        self, table: str, order_by: Sequence[str], key: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """The ``key`` values of ``table``'s rows in the database's ``ORDER BY order_by``."""
        raise NotImplementedError

    # -- the tests ---------------------------------------------------------------------------

    @pytest.fixture
    def opened(self) -> Iterator[list[Source]]:
        sources: list[Source] = []
        yield sources
        for source in sources:
            source.close()

    def _open(
        self,
        opened: list[Source],
        table: str,
        cursor: Sequence[str],
        pk: Sequence[str],
        **options: Any,
    ) -> Source:
        source = self.source(table, cursor, pk, **options)
        opened.append(source)
        return source

    def _ties(self, table: str, n: int = 50) -> list[tuple[Any, ...]]:
        rows = [{"id": i, "updated_at": (i * 7) % 10, "note": f"n{i}"} for i in range(n)]
        cols = {"id": self.int_type, "updated_at": self.int_type, "note": self.text_type}
        self.create(table, cols, ["id"], rows)
        return self.ordered(table, ["updated_at", "id"], ["id"])

    @pytest.mark.parametrize("batch", [1, 7, 50, 1000])
    def test_drains_every_row_once_in_the_database_keyset_order(
        self, opened: list[Source], batch: int
    ) -> None:
        expected = self._ties("t_drain")
        source = self._open(opened, "t_drain", ["updated_at"], ["id"])
        rows = drain(source, batch)
        assert _pk(rows) == expected
        assert all(row.data["note"] == f"n{row.data['id']}" for row in rows)

    def test_a_position_resumes_after_exactly_its_own_row(self, opened: list[Source]) -> None:
        expected = self._ties("t_resume", 20)
        source = self._open(opened, "t_resume", ["updated_at"], ["id"])
        first = source.fetch(None, 9, NO_HORIZON)
        after = through_checkpoint(source, first[-1].position)
        assert _pk(first) + _pk(drain(source, 4, after)) == expected

    def test_rows_written_after_a_position_are_read_next(self, opened: list[Source]) -> None:
        self._ties("t_later", 10)
        source = self._open(opened, "t_later", ["updated_at"], ["id"])
        read = drain(source, 3)
        self.insert(
            "t_later", [{"id": 100 + i, "updated_at": 20 + i, "note": "late"} for i in range(3)]
        )
        assert _pk(drain(source, 2, read[-1].position)) == [(100,), (101,), (102,)]

    def test_composite_cursor_and_key(self, opened: list[Source]) -> None:
        rows = [{"a": i % 3, "b": i % 2, "k1": i % 4, "k2": i, "note": str(i)} for i in range(24)]
        i, t = self.int_type, self.text_type
        self.create("t_comp", {"a": i, "b": i, "k1": i, "k2": i, "note": t}, ["k1", "k2"], rows)
        expected = self.ordered("t_comp", ["a", "b", "k1", "k2"], ["k1", "k2"])
        source = self._open(opened, "t_comp", ["a", "b"], ["k1", "k2"])
        for batch in (1, 5):
            assert _pk(drain(source, batch)) == expected

    def test_null_cursors_are_counted_and_never_returned(self, opened: list[Source]) -> None:
        rows = [{"id": i, "updated_at": None if i % 4 == 0 else i} for i in range(12)]
        self.create(
            "t_null", {"id": self.int_type, "updated_at": self.int_type + "?"}, ["id"], rows
        )
        source = self._open(opened, "t_null", ["updated_at"], ["id"])
        assert sorted(_pk(drain(source, 5))) == [(i,) for i in range(12) if i % 4]
        assert source.check().null_cursor_rows == 3
        strict = self._open(opened, "t_null", ["updated_at"], ["id"], on_null_cursor="raise")
        with pytest.raises(NullCursorError):
            strict.check()

    def test_a_null_in_a_later_cursor_column_is_excluded_too(self, opened: list[Source]) -> None:
        rows: list[dict[str, Any]] = [
            {"id": 1, "a": 1, "b": None},
            {"id": 2, "a": 1, "b": 2},
            {"id": 3, "a": None, "b": 1},
        ]
        cols = {"id": self.int_type, "a": self.int_type + "?", "b": self.int_type + "?"}
        self.create("t_null2", cols, ["id"], rows)
        source = self._open(opened, "t_null2", ["a", "b"], ["id"])
        assert source.check().null_cursor_rows == 2
        assert _pk(drain(source, 1)) == [(2,)]

    def test_a_position_without_key_values_starts_at_its_cursor(self, opened: list[Source]) -> None:
        """What ``afdb seek --cursor 5`` stores: every row with cursor 5 or more, ties included."""
        expected = self._ties("t_seek", 30)
        source = self._open(opened, "t_seek", ["updated_at"], ["id"])
        after = Position(cursor=(5,), pk=())
        assert _pk(drain(source, 4, after)) == [k for k in expected if k[0] * 7 % 10 >= 5]

    def test_an_empty_table_has_no_latest_and_no_rows(self, opened: list[Source]) -> None:
        empty: list[dict[str, Any]] = []
        self.create("t_empty", {"id": self.int_type, "updated_at": self.int_type}, ["id"], empty)
        source = self._open(opened, "t_empty", ["updated_at"], ["id"])
        assert source.latest(NO_HORIZON) is None
        assert list(source.fetch(None, 10, NO_HORIZON)) == []

    def test_horizon_bound_is_exclusive_and_until_is_inclusive(self, opened: list[Source]) -> None:
        expected = self._ties("t_bound", 30)
        source = self._open(opened, "t_bound", ["updated_at"], ["id"])
        below = drain(source, 4, horizon=Horizon(bound=5, method="test"))
        assert _pk(below) == [k for k in expected if k[0] * 7 % 10 < 5]
        end = source.fetch(None, 12, NO_HORIZON)[-1].position
        upto = drain(source, 5, horizon=Horizon(bound=None, method="test", until=end))
        assert _pk(upto) == expected[:12]

    def test_latest_is_the_last_row_under_the_horizon(self, opened: list[Source]) -> None:
        expected = self._ties("t_latest", 15)
        source = self._open(opened, "t_latest", ["updated_at"], ["id"])
        latest = source.latest(NO_HORIZON)
        assert latest is not None
        assert tuple(latest.pk) == expected[-1]
        assert source.fetch(through_checkpoint(source, latest), 10, NO_HORIZON) == []

    def test_a_missing_column_is_a_clear_error(self, opened: list[Source]) -> None:
        self._ties("t_missing", 3)
        with pytest.raises(SourceDefinitionError, match="nope"):
            self._open(opened, "t_missing", ["nope"], ["id"])

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """One test per declared key type (``type_cases`` of the subclass)."""
        if "type_case" in metafunc.fixturenames:
            cases: list[TypeCase | None] = [*type(self).type_cases] or [None]
            metafunc.parametrize("type_case", cases, ids=[c.id if c else "none" for c in cases])

    @pytest.mark.parametrize("batch", [1, 2])
    def test_a_key_type_as_cursor_selects_its_own_row_and_excludes_it(
        self, opened: list[Source], type_case: TypeCase | None, batch: int
    ) -> None:
        """Each value twice (a tie on the cursor), drained one or two rows per batch through
        positions that went through a checkpoint: a bound that does not equal its own stored
        value either re-reads its row for ever or skips the row tied with it. Every row once,
        in the database's order."""
        case = self._case(type_case)
        rows = [
            {"id": i * 10 + copy, "c": value}
            for i, value in enumerate(case.values)
            for copy in (1, 0)
        ]
        self.create("t_tcur", {"id": self.int_type, "c": case.type}, ["id"], rows)
        expected = self.ordered("t_tcur", ["c", "id"], ["id"])
        source = self._typed(opened, case, "t_tcur", ["c"], ["id"])
        assert _pk(drain(source, batch)) == expected

    @pytest.mark.parametrize("batch", [1, 2])
    def test_a_key_type_as_primary_key_splits_ties_in_the_database_order(
        self, opened: list[Source], type_case: TypeCase | None, batch: int
    ) -> None:
        """Every row tied on the cursor, so the key alone orders them: a collation or a type that
        orders unlike Python (case-insensitive, ICU, MariaDB's UUID) must still give each row
        once, in the database's order; and a bound ``until`` inside the tie group (a backfill
        chunk's end) stops exactly at its row."""
        case = self._case(type_case)
        rows = [{"c": value, "g": 7, "n": i} for i, value in enumerate(case.values)]
        cols = {"c": case.type, "g": self.int_type, "n": self.int_type}
        self.create("t_tpk", cols, ["c"], rows)
        expected = self.ordered("t_tpk", ["g", "c"], ["n"])
        source = self._typed(opened, case, "t_tpk", ["g"], ["c"])
        got = drain(source, batch)
        assert [(row.data["n"],) for row in got] == expected
        end = through_checkpoint(source, got[1].position)
        upto = drain(source, batch, horizon=Horizon(bound=None, method="test", until=end))
        assert [(row.data["n"],) for row in upto] == expected[:2]

    def _case(self, type_case: TypeCase | None) -> TypeCase:
        if type_case is None:
            pytest.skip("not applicable: this adapter declares no key types")
        return type_case

    def _typed(
        self, opened: list[Source], case: TypeCase, table: str, cursor: list[str], pk: list[str]
    ) -> Source:
        try:
            return self._open(opened, table, cursor, pk)
        except SourceDefinitionError as exc:  # refused with a clear error: never polled wrong
            pytest.fail(f"{case.id} refused: {exc}")


@dataclass(frozen=True)
class Scratch:
    """An empty namespace on a database: the URL the source uses, its schema, and the URL to
    set tables up with (default: the same; an ODBC source's tables are made natively)."""

    url: str
    schema: str | None = None
    setup_url: str | None = None


class SqlSourceContract(SourceContract):
    """:class:`SourceContract` for :class:`~azure_functions_db.SqlSource` over any SQLAlchemy
    URL. A subclass provides a ``scratch`` fixture (a :class:`Scratch`, emptied after the test)
    and its ``type_cases``, with :class:`Literal` values written as SQL text."""

    @pytest.fixture(autouse=True)
    def _database(self, scratch: Scratch) -> Iterator[None]:
        self._scratch = scratch
        self._engine = sa.create_engine(scratch.setup_url or scratch.url, poolclass=sa.NullPool)
        yield
        self._engine.dispose()

    def _name(self, table: str) -> str:
        quote = self._engine.dialect.identifier_preparer.quote
        schema = self._scratch.schema
        return f"{quote(schema)}.{quote(table)}" if schema else quote(table)

    def create(
        self,
        table: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        quote = self._engine.dialect.identifier_preparer.quote
        defs = [
            f"{quote(name)} {kind.removesuffix('?')}{'' if kind.endswith('?') else ' NOT NULL'}"
            for name, kind in columns.items()
        ]
        keys = ", ".join(quote(k) for k in key)
        with self._engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE {self._name(table)} ({', '.join(defs)}, PRIMARY KEY ({keys}))"
            )
        self.insert(table, rows)

    def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        quote = self._engine.dialect.identifier_preparer.quote
        with self._engine.begin() as conn:
            for row in rows:
                names = ", ".join(quote(c) for c in row)
                values = ", ".join(v if isinstance(v, Literal) else f":{c}" for c, v in row.items())
                params = {c: v for c, v in row.items() if not isinstance(v, Literal)}
                conn.execute(
                    sa.text(f"INSERT INTO {self._name(table)} ({names}) VALUES ({values})"), params
                )

    def source(
        self, table: str, cursor: Sequence[str], pk: Sequence[str], **options: Any
    ) -> Source:
        from azure_functions_db.sources.sqlalchemy import SqlSource

        source = SqlSource(
            self._scratch.url,
            table,
            cursor,
            pk,
            schema=self._scratch.schema,
            horizon="none",
            **options,
        )
        source.open({})
        return source

    def ordered(
        self, table: str, order_by: Sequence[str], key: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        quote = self._engine.dialect.identifier_preparer.quote
        cols = ", ".join(quote(k) for k in key)
        order = ", ".join(quote(c) for c in order_by)
        with self._engine.connect() as conn:
            result = conn.exec_driver_sql(
                f"SELECT {cols} FROM {self._name(table)} ORDER BY {order}"
            )
            return [tuple(row) for row in result]

    @pytest.mark.parametrize("batch", [1, 7, 1000])
    def test_a_split_read_on_another_thread_is_the_fetch(
        self, opened: list[Source], batch: int
    ) -> None:
        """``ReadAheadSource``: ``select`` on a worker thread, then ``changes_of`` on this one,
        reads exactly what ``fetch`` reads, and the last change's position is ``last``."""
        expected = self._ties("t_split")
        source = self._open(opened, "t_split", ["updated_at"], ["id"])
        assert isinstance(source, ReadAheadSource)
        assert source.reads_from_any_thread
        pks: list[tuple[Any, ...]] = []
        after: Position | None = None
        with ThreadPoolExecutor(max_workers=1) as worker:
            for _ in range(len(expected) + 1):
                selected = worker.submit(source.select, after, batch, NO_HORIZON).result()
                changes = source.changes_of(selected, "contract")
                assert len(changes) == len(selected.rows) <= batch
                if not changes:
                    break
                assert changes[-1].position is selected.last
                assert list(changes) == [
                    Change(r.data, r.position, "contract", r.op)
                    for r in source.fetch(after, batch, NO_HORIZON)
                ]
                pks.extend(tuple(c.position.pk) for c in changes)
                after = through_checkpoint(source, changes[-1].position)
        assert pks == expected
