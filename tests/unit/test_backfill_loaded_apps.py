"""What a backfill keeps loaded between calls: the driver's app and source, the workers' apps."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from azure_functions_db.runtime import loader
from azure_functions_db.sources import SqlSource
from azure_functions_db.spark import _apps, task
from tests.support.sqlite_orders import Orders

APP = textwrap.dedent(
    """
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%LOADED_DB%", table="orders", cursor="updated_at", pk="id"),
    )
    def on_orders(batch: afdb.Batch) -> None:
        pass
    """
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    yield path
    for key in [k for k in _apps._driver_apps if k[0] == str(path)]:
        _apps._driver_apps.pop(key).definition.source.close()
    for loaded in [k for k in task._loaded if k[0] == str(path)]:
        task._loaded.pop(loaded).source.close()


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[dict[str, str]]:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 4))
    yield {"LOADED_DB": orders.url}
    orders.close()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The specs the app loader imported."""
    calls: list[str] = []
    load = loader.load_pollers

    def counted(spec: str) -> dict[str, object]:
        calls.append(spec)
        return load(spec)  # type: ignore[return-value]

    monkeypatch.setattr(loader, "load_pollers", counted)
    return calls


def _changed(path: Path) -> None:
    """Edit the app file so that its size and modification time change."""
    path.write_text(path.read_text() + "\n# edited\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_the_driver_loads_an_unchanged_app_once_and_keeps_its_source_open(app, settings, loads):
    _, first = _apps.driver_definition(app, "orders", settings)
    first.source.open(settings)
    _apps.release(first.source)

    _, again = _apps.driver_definition(app, "orders", settings)

    assert again is first
    assert len(loads) == 1
    assert isinstance(again.source, SqlSource)
    assert again.source.description.columns is not None  # still open: not reflected again
    assert again.source.engine.pool.checkedin() == 0  # no idle connection was left behind
    assert again.source.latest(again.source.horizon()) is not None  # and it reads again


def test_a_changed_app_file_is_loaded_again_and_the_old_source_closed(app, settings, loads):
    _, first = _apps.driver_definition(app, "orders", settings)
    first.source.open(settings)
    _changed(app)

    _, again = _apps.driver_definition(app, "orders", settings)

    assert again is not first
    assert len(loads) == 2
    assert isinstance(first.source, SqlSource)
    assert first.source.description.columns is None  # closed


def test_other_settings_load_the_app_again(app, settings, loads, tmp_path):
    _, first = _apps.driver_definition(app, "orders", settings)
    other = Orders(tmp_path / "other.db")
    try:
        _, again = _apps.driver_definition(app, "orders", {"LOADED_DB": other.url})
    finally:
        other.close()

    assert again is not first
    assert len(loads) == 2


def test_a_worker_loads_the_app_again_when_the_drivers_version_changed(app, settings, loads):
    shipped = tuple(settings.items())
    version = task.app_version(str(app))
    first = task.definition_for(str(app), "orders", shipped, version)
    assert task.definition_for(str(app), "orders", shipped, version) is first
    _changed(app)

    again = task.definition_for(str(app), "orders", shipped, task.app_version(str(app)))

    assert again is not first
    assert len(loads) == 2


def test_the_version_of_an_app_is_its_files_and_none_for_a_module(app):
    stat = app.stat()
    assert task.app_version(str(app)) == (stat.st_mtime_ns, stat.st_size)
    assert task.app_version(str(app.parent)) == (stat.st_mtime_ns, stat.st_size)
    assert task.app_version(f"{app}:db") == (stat.st_mtime_ns, stat.st_size)
    assert task.app_version("function_app_module:db") is None
