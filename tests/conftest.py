"""Shared fixtures and the CI guard: in CI (``CI=true``) a skipped test fails the session.

Azure Storage tests run against the real Azurite (``devkit/azurite.py``): the session-scoped
``azurite`` fixture, unique ``azurite_container`` / ``azurite_table_name`` names that are deleted
after each test, and ``private_azurite`` for a test that needs an emulator of its own. Every test
that uses one of them gets the ``azurite`` marker.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from azure_functions_db.sources import SqlSource
    from devkit.azurite import Azurite
    from tests.support.source_kit import Db

_skipped: list[str] = []
_AZURITE_FIXTURES = frozenset({"azurite", "private_azurite"})
_shared_azurite: list[Azurite] = []  # the session's instance, once the fixture made it


#: A skip whose reason starts with this is a test that cannot apply to an adapter (say, moving
#: Azure's lease clock to an exact instant), not a service tier that failed to run.
NOT_APPLICABLE = "not applicable:"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if not str(reason).removeprefix("Skipped: ").startswith(NOT_APPLICABLE):
            _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI", "").lower() == "true" and _skipped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"CI=true: {len(_skipped)} test(s) were skipped; in CI every service tier must "
                "run. Skipped: " + ", ".join(_skipped[:20]),
                red=True,
                bold=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- Azurite --------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _AZURITE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.azurite)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A test that stopped, killed or paused the shared Azurite and failed before undoing it must
    # not take every later test down with it.
    if _shared_azurite and "azurite" in getattr(item, "fixturenames", ()):
        _shared_azurite[0].ensure_running()


def _skip_unless_azurite_installed() -> None:
    from devkit.azurite import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """The one Azurite of this run (Blob + Table on free loopback ports, data on disk).

    A test may ``restart()``, ``kill()`` or ``pause()`` it, and must leave it running.
    """
    from devkit.azurite import Azurite

    _skip_unless_azurite_installed()
    instance = Azurite(tmp_path_factory.mktemp("azurite")).start()
    _shared_azurite.append(instance)
    try:
        yield instance
    finally:
        _shared_azurite.clear()
        instance.stop()


@pytest.fixture
def private_azurite(tmp_path: Path) -> Iterator[Azurite]:
    """An Azurite of this test's own, for tests that would disturb the shared one."""
    from devkit.azurite import Azurite

    _skip_unless_azurite_installed()
    with Azurite(tmp_path / "azurite") as instance:
        yield instance


@pytest.fixture
def azurite_container(azurite: Azurite) -> Iterator[str]:
    """A fresh blob container name (``t-`` + 12 hex digits); the test creates the container if it
    needs one, and it is deleted afterwards, leases and all."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
    from azure.storage.blob import BlobLeaseClient, BlobServiceClient

    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    azurite.ensure_running()
    with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        container = service.get_container_client(name)
        try:
            container.delete_container()
        except ResourceNotFoundError:
            pass
        except HttpResponseError as exc:
            if exc.error_code != "LeaseIdMissing":
                raise
            BlobLeaseClient(container).break_lease(lease_break_period=0)
            container.delete_container()


@pytest.fixture
def azurite_table_name(azurite: Azurite) -> Iterator[str]:
    """A fresh table name (``t`` + 12 hex digits); the table is deleted afterwards if it exists."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.data.tables import TableServiceClient

    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    azurite.ensure_running()
    with (
        TableServiceClient.from_connection_string(azurite.connection_string) as service,
        contextlib.suppress(ResourceNotFoundError),
    ):
        service.delete_table(name)


# -- PostgreSQL and MariaDB (devkit/dbservers.py) ----------------------------------------------


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The URL of PostgreSQL's ``test`` database; skips (failing CI) if the server is down."""
    from devkit import dbservers

    url = dbservers.pg_url()
    reason = dbservers.unavailable_reason(url, "PostgreSQL")
    if reason is not None:
        pytest.skip(reason)
    return url


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """The URL of MariaDB's ``test`` database; skips (failing CI) if the server is down."""
    from devkit import dbservers

    url = dbservers.mysql_url()
    reason = dbservers.unavailable_reason(url, "MariaDB")
    if reason is not None:
        pytest.skip(reason)
    return url


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A fresh schema ``t_<hex>`` in PostgreSQL's ``test`` database, dropped CASCADE after."""
    from devkit import dbservers

    with dbservers.pg_schema(pg_url) as name:
        yield name


@pytest.fixture
def mysql_db(mysql_url: str) -> Iterator[str]:
    """A fresh MariaDB database ``t_<hex>``, dropped after (URL: ``dbservers.mysql_url(name)``)."""
    from devkit import dbservers

    with dbservers.mysql_database(mysql_url) as name:
        yield name


@pytest.fixture
def opened() -> Iterator[list[SqlSource]]:
    """Sources appended here are closed after the test."""
    sources: list[SqlSource] = []
    yield sources
    for source in sources:
        source.close()


# PostgreSQL and MariaDB scratch namespaces wrapped as `Db` (tests/support/source_kit.py)


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def db(request: pytest.FixtureRequest) -> Iterator[Db]:
    import sqlalchemy as sa

    from devkit import dbservers
    from tests.support.source_kit import Db

    if request.param == "postgres":
        schema = request.getfixturevalue("pg_schema")
        url, namespace = dbservers.pg_url(), schema
    else:
        database = request.getfixturevalue("mysql_db")
        url, namespace = dbservers.mysql_url(database), None
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        yield Db(request.param, url, namespace, engine)
    finally:
        engine.dispose()


@pytest.fixture
def pg(pg_schema: str) -> Iterator[Db]:
    import sqlalchemy as sa

    from devkit import dbservers
    from tests.support.source_kit import Db

    engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    try:
        yield Db("postgres", dbservers.pg_url(), pg_schema, engine)
    finally:
        engine.dispose()


@pytest.fixture
def maria(mysql_db: str) -> Iterator[Db]:
    import sqlalchemy as sa

    from devkit import dbservers
    from tests.support.source_kit import Db

    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        yield Db("mysql", url, None, engine)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One Spark ``local[2]`` session for the whole test session (JVM start-up costs seconds)."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("afdb-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def odbc_drivers() -> None:
    """pyodbc with both test ODBC drivers installed (and the test-only PostgreSQL dialect
    registered); skips (failing CI) with the fix otherwise."""
    from devkit import odbc_dialects as odbc

    missing = [
        d for d in (odbc.PG_DRIVER, odbc.MARIADB_DRIVER) if d not in odbc.installed_drivers()
    ]
    if missing:
        pytest.skip(
            f"ODBC drivers {missing} are not installed: `apt-get install unixodbc "
            "odbc-postgresql odbc-mariadb` (make test does) and `pip install -e '.[dev]'` (pyodbc)"
        )
    odbc.register()
