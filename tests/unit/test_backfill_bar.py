"""The backfill's progress line at 80 columns: every number whole (it wraps, nothing is cut)."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from azure_functions_db.spark import backfill_cli
from azure_functions_db.spark.job import BackfillProgress


@pytest.mark.parametrize("width", [80, 60])
def test_the_progress_line_is_never_cut(width, monkeypatch):
    out = io.StringIO()
    stderr = Console(file=out, width=width, force_terminal=True, record=True)
    seen: list[str] = []

    def fake_backfill(*_: object, progress, **__: object):  # type: ignore[no-untyped-def]
        progress(
            BackfillProgress(
                run_id="20261126T214500Z",
                rows_done=456_789,
                rows_estimated=1_000_000,
                chunks_done=12,
                chunks_total=32,
                elapsed=3.7,
                rate=123_456.0,
                eta=83.0,
                final=False,
            )
        )
        seen.append(stderr.export_text())
        raise SystemExit(0)

    monkeypatch.setattr(backfill_cli, "backfill", fake_backfill)
    monkeypatch.setattr(backfill_cli, "backfill_names", lambda _app, poller: [poller])
    args = argparse.Namespace(
        json=False, app="a", poller="p", start=None, end=None, partitions=None, master="local",
        namespace="backfill", run_id=None, new_run=False, app_settings={},
    )  # fmt: skip
    with pytest.raises(SystemExit):
        backfill_cli.run_backfill_command(args, Console(file=io.StringIO()), stderr)
    text = "".join(seen) + out.getvalue()
    assert "…" not in text
    flat = text.replace("\n", "")
    for whole in ("20261126T214500Z", "456,789/1,000,000 rows", "12/32 chunks", "ETA 0:01:23"):
        assert whole in flat, text
