"""A horizon's bound in the column's own form, cut down to the unit the column stores."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, postgresql

from azure_functions_db.sources.values import fraction_digits, time_bound

MOMENT = dt.datetime(2026, 11, 27, 12, 0, 0, 987654, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("type_", "digits", "bound"),
    [
        (mysql.DATETIME(), 0, dt.datetime(2026, 11, 27, 12, 0, 0)),
        (mysql.TIMESTAMP(), 0, dt.datetime(2026, 11, 27, 12, 0, 0)),
        (mysql.DATETIME(fsp=3), 3, dt.datetime(2026, 11, 27, 12, 0, 0, 987000)),
        (mysql.DATETIME(fsp=6), 6, dt.datetime(2026, 11, 27, 12, 0, 0, 987654)),
        (postgresql.TIMESTAMP(precision=0), 0, dt.datetime(2026, 11, 27, 12, 0, 0)),
        (postgresql.TIMESTAMP(), 6, dt.datetime(2026, 11, 27, 12, 0, 0, 987654)),
        (sa.DateTime(), 6, dt.datetime(2026, 11, 27, 12, 0, 0, 987654)),
        (mssql.DATETIME2(precision=7), 6, dt.datetime(2026, 11, 27, 12, 0, 0, 987654)),
    ],
)
def test_bound_is_cut_down_to_the_columns_unit(
    type_: sa.types.TypeEngine[object], digits: int, bound: dt.datetime
) -> None:
    column: sa.Column[object] = sa.Column("updated_at", type_)
    assert fraction_digits(column) == digits
    assert time_bound(MOMENT, column, dt.UTC) == bound


def test_aware_whole_second_column_keeps_utc() -> None:
    column: sa.Column[object] = sa.Column(
        "updated_at", postgresql.TIMESTAMP(timezone=True, precision=0)
    )
    assert time_bound(MOMENT, column, dt.UTC) == dt.datetime(2026, 11, 27, 12, 0, 0, tzinfo=dt.UTC)


def test_naive_column_is_cut_in_its_own_zone() -> None:
    zone = dt.timezone(dt.timedelta(hours=5, minutes=30))
    column: sa.Column[object] = sa.Column("updated_at", mysql.DATETIME())
    assert time_bound(MOMENT, column, zone) == dt.datetime(2026, 11, 27, 17, 30, 0)
