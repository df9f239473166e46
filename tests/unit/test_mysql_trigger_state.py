"""What is read of Azure's MySQL trigger's state that needs no server: its ids, and a wall time
the clocks went through twice taken at its earlier instant (against a stand-in for the
server's two conversions in Europe/Berlin; the takeover's tests run on the real MariaDB)."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.ops.mysql_trigger_state import (
    earliest_epoch,
    user_function_id,
    user_table_id,
)

BERLIN = ZoneInfo("Europe/Berlin")


def test_the_ids_are_the_ones_the_trigger_computes() -> None:
    """SHA-256 printed as a .NET Guid: its first three groups byte-reversed."""
    assert user_function_id("mysite", "ProductsTrigger") == "f92fd06339e77528"
    assert user_table_id("testdb", "Products") == "2a0159833c84fb9f328bb03a18a3b574"
    with pytest.raises(ConfigurationError, match="WEBSITE_SITE_NAME"):
        user_function_id("", "ProductsTrigger")


class _Berlin:
    """The two conversions the server makes in a session in Europe/Berlin: ``UNIX_TIMESTAMP``
    of a wall time (of one that occurs twice, MariaDB gives the later instant) and
    ``FROM_UNIXTIME`` back to a wall time."""

    def execute(self, statement: Any, params: dict[str, Any]) -> Any:
        text = str(statement)
        if "UNIX_TIMESTAMP" in text:
            wall = dt.datetime.fromisoformat(params["w"])
            later = wall.replace(tzinfo=BERLIN, fold=1)
            return _Scalar(int(later.timestamp()))
        moment = dt.datetime.fromtimestamp(params["e"], BERLIN)
        return _Scalar(moment.strftime("%Y-%m-%d %H:%M:%S"))


class _Scalar:
    def __init__(self, value: Any) -> None:
        self.value = value

    def scalar_one(self) -> Any:
        return self.value


def test_a_wall_time_the_clocks_went_through_twice_is_its_earlier_instant() -> None:
    conn: Any = _Berlin()
    # 2025-10-26 02:30 happened at 00:30 UTC (summer time) and again at 01:30 UTC.
    first = dt.datetime(2025, 10, 26, 0, 30, tzinfo=dt.UTC).timestamp()
    assert earliest_epoch(conn, "2025-10-26 02:30:00") == first
    # An ordinary time is taken as it is.
    noon = dt.datetime(2025, 10, 26, 11, 0, tzinfo=dt.UTC).timestamp()
    assert earliest_epoch(conn, "2025-10-26 12:00:00") == noon
