"""A chunk task leaves no zip importer for PySpark's next task to re-read (Python < 3.13)."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from pathlib import Path

import pytest

from azure_functions_db.spark import task as task_module
from azure_functions_db.spark.task import ChunkTask, forget_zip_importers

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="zip importers re-read lazily from Python 3.13 on"
)


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Path]:
    """A zip on sys.path holding the package ``afdb_zipped`` (module ``first``)."""
    path = tmp_path / "lib.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("afdb_zipped/__init__.py", "")
        zipped.writestr("afdb_zipped/first.py", "VALUE = 1\n")
    sys.path.insert(0, str(path))
    try:
        yield path
    finally:
        sys.path.remove(str(path))
        for name in [n for n in sys.modules if n.startswith("afdb_zipped")]:
            del sys.modules[name]
        for entry in [e for e in sys.path_importer_cache if e.startswith(str(path))]:
            del sys.path_importer_cache[entry]
        getattr(zipimport, "_zip_directory_cache", {}).pop(str(path), None)


def _reads_of(archive: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(path: str) -> object:
        if path == str(archive):
            reads.append(path)
        return read_directory(path)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    return reads


def test_the_next_invalidation_reads_no_archive_again(archive, monkeypatch):
    importlib.import_module("afdb_zipped.first")  # an importer for the zip and one for the package
    reads = _reads_of(archive, monkeypatch)
    importlib.invalidate_caches()  # what PySpark's worker does before each task
    assert reads, "the importers of an archive re-read it when caches are invalidated"
    reads.clear()

    forget_zip_importers()
    importlib.invalidate_caches()

    assert reads == []
    assert not [
        finder
        for finder in sys.path_importer_cache.values()
        if isinstance(finder, zipimport.zipimporter)
    ]


def test_modules_added_to_an_archive_later_are_still_found(archive):
    assert importlib.import_module("afdb_zipped.first").VALUE == 1
    forget_zip_importers()
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("afdb_zipped/second.py", "VALUE = 2\n")
    importlib.invalidate_caches()

    assert importlib.import_module("afdb_zipped.second").VALUE == 2


def test_a_chunk_task_forgets_the_importers_even_when_it_fails(archive, monkeypatch):
    importlib.import_module("afdb_zipped.first")

    def failing(task: ChunkTask) -> None:
        raise RuntimeError("handler failed")

    monkeypatch.setattr(task_module, "_run", failing)
    with pytest.raises(RuntimeError, match="handler failed"):
        task_module.run_chunk_task(ChunkTask("app.py", "orders", "backfill", "r1", 0, ()))

    assert not [e for e in sys.path_importer_cache if e.startswith(str(archive))]
