"""``log_event``: stable ``action=`` lines whose ``extra`` values every log exporter accepts."""

from __future__ import annotations

import logging

import pytest

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.position import Position


def test_extra_values_are_plain_and_the_source_is_the_caller(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("afdb.test.logs")
    position = Position(cursor=(5,), pk=(7,))
    with caplog.at_level(logging.INFO, logger="afdb.test.logs"):
        log_event(logger, logging.INFO, "batch_committed", rows=3, position=position, gone=None)
    (record,) = caplog.records
    assert record.getMessage() == f"action=batch_committed rows=3 position={position}"
    assert record.__dict__["afdb_rows"] == 3  # numbers stay numbers
    assert record.__dict__["afdb_position"] == str(position)  # objects travel as text
    assert "afdb_gone" not in record.__dict__
    assert record.funcName == "test_extra_values_are_plain_and_the_source_is_the_caller"
