"""Storage connection settings, read as the Functions host reads them; and the Azure default."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

import azure_functions_db as afdb
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.storage import SDK_REQUEST_LOGGER, resolve_storage
from azure_functions_db.state.table import TableStateStore
from devkit.azurite import Azurite
from tests.e2e.test_cli import app
from tests.support.sqlite_orders import Orders

__all__ = ["app"]  # fixture: the CLI test app, its settings in the environment

KEY = "c2VjcmV0LWtleS1ub3QtdG8tbGVhaw=="
CONN = (
    "DefaultEndpointsProtocol=https;AccountName=prodacct;AccountKey="
    + KEY
    + ";EndpointSuffix=core.windows.net"
)


def test_connection_string_wins_and_never_shows_its_key():
    target = resolve_storage({"AzureWebJobsStorage": CONN}, "AzureWebJobsStorage")
    assert target.connection_string == CONN
    assert target.account == "prodacct"
    assert KEY not in repr(target)
    store = BlobStateStore(settings={"AzureWebJobsStorage": CONN})
    assert store.describe() == "blob:prodacct/afdb-state"
    assert KEY not in repr(store)
    assert KEY not in store.describe()


def test_development_storage_is_azurite_defaults():
    settings = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}
    assert resolve_storage(settings, "AzureWebJobsStorage").account == "devstoreaccount1"
    blob = BlobStateStore(settings=settings)
    assert blob.container.url.startswith("http://127.0.0.1:10000/devstoreaccount1/")
    table = TableStateStore(settings=settings)
    assert table.table.url.startswith("http://127.0.0.1:10002/devstoreaccount1")


def test_identity_based_account_name_uses_default_azure_credential():
    settings = {"AzureWebJobsStorage__accountName": "prodacct"}
    target = resolve_storage(settings, "AzureWebJobsStorage")
    assert target.connection_string is None
    assert target.blob_url == "https://prodacct.blob.core.windows.net"
    assert target.table_url == "https://prodacct.table.core.windows.net"
    assert isinstance(target.credential, DefaultAzureCredential)
    assert BlobStateStore(settings=settings).container.url == (
        "https://prodacct.blob.core.windows.net/afdb-state"
    )


def test_identity_based_service_uris_and_managed_identity_client_id():
    settings = {
        "Storage__blobServiceUri": "https://custom.blob.core.windows.net",
        "Storage__tableServiceUri": "https://custom.table.core.windows.net",
        "Storage__credential": "managedidentity",
        "Storage__clientId": "00000000-0000-0000-0000-000000000001",
    }
    target = resolve_storage(settings, "Storage")
    assert target.blob_url == "https://custom.blob.core.windows.net"
    assert target.table_url == "https://custom.table.core.windows.net"
    assert target.account == "custom"
    assert isinstance(target.credential, ManagedIdentityCredential)
    store = TableStateStore("Storage", settings=settings)
    assert store.table.url.startswith("https://custom.table.core.windows.net")


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({}, "App setting `AzureWebJobsStorage` is not defined"),
        ({"AzureWebJobsStorage": "just-a-key"}, "does not look like a storage connection string"),
    ],
)
def test_bad_or_missing_settings_name_the_setting_not_the_value(settings, needle):
    with pytest.raises(ConfigurationError) as info:
        BlobStateStore(settings=settings).container  # noqa: B018 - resolving is the test
    assert needle in str(info.value)
    assert "just-a-key" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"container": "Bad_Name"}, "Bad_Name"),
        ({"container": "ab"}, "`ab`"),
        ({"connection": ""}, "connection=''"),
    ],
)
def test_store_arguments_are_checked_naming_the_value(kwargs, needle):
    with pytest.raises(ConfigurationError) as info:
        BlobStateStore(**kwargs)
    assert needle in str(info.value)


def test_table_name_is_checked():
    with pytest.raises(ConfigurationError, match="bad-table"):
        TableStateStore(table="bad-table")


@pytest.mark.parametrize("duration", [10, 61, 15.5])
def test_azure_lease_durations_outside_15_to_60_whole_seconds_are_refused(duration):
    from azure_functions_db.core.checkpoint import PollerKey

    store = BlobStateStore(settings={"AzureWebJobsStorage": "UseDevelopmentStorage=true"})
    with pytest.raises(ConfigurationError, match="15 to 60"):
        store.acquire(PollerKey("live", "x"), "me", duration)


def test_a_poller_with_only_azurewebjobsstorage_set_needs_no_manual_setup(
    azurite: Azurite, tmp_path: Path
):
    """Under a Functions host, a poller with no `state=` keeps its state in Blob Storage on the
    AzureWebJobsStorage account, and creates what it needs there itself."""
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 8))
    orders.close()
    db = afdb.PollerBlueprint()
    seen: list[int] = []
    name = f"orders-{uuid.uuid4().hex[:8]}"

    @db.poller(
        name=name,
        schedule="0 * * * * *",
        source=afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        batch_size=3,
    )
    def handler(batch: afdb.Batch) -> None:
        seen.extend(c.pk for c in batch)

    settings = {
        "FUNCTIONS_WORKER_RUNTIME": "python",
        "AzureWebJobsStorage": azurite.connection_string,
    }
    report = db.pollers[name].run_once(settings)
    assert (report.rows, seen) == (7, list(range(1, 8)))
    store = db.pollers[name].store(settings)
    assert isinstance(store, BlobStateStore)
    assert store.describe() == "blob:devstoreaccount1/afdb-state"
    record = store.read(afdb.PollerKey("live", name))
    assert record is not None
    assert record.checkpoint.stats.rows == 7


@pytest.mark.parametrize(
    ("preset", "expected"), [(None, logging.WARNING), (logging.DEBUG, logging.DEBUG)]
)
def test_sdk_request_logs_are_quieted_unless_the_app_set_their_level(monkeypatch, preset, expected):
    logger = logging.getLogger(SDK_REQUEST_LOGGER)
    monkeypatch.setattr(logger, "level", logging.NOTSET if preset is None else preset)
    resolve_storage({"AzureWebJobsStorage": "UseDevelopmentStorage=true"}, "AzureWebJobsStorage")
    assert logger.level == expected


@pytest.mark.parametrize("kind", ["blob", "table", "queue"])
def test_an_http_service_uri_is_refused_naming_the_setting_and_the_fix(kind):
    """The Azure SDK refuses a token over HTTP with a traceback; say which setting and what to
    set instead (Azurite serves HTTP: its connection string, not an identity URI)."""
    name = f"AzureWebJobsStorage__{kind}ServiceUri"
    settings = {name: f"http://127.0.0.1:10000/devstoreaccount1/{kind}"}
    with pytest.raises(ConfigurationError) as caught:
        resolve_storage(settings, "AzureWebJobsStorage")
    message = str(caught.value)
    assert f"`{name}`" in message
    assert "https://" in message
    assert "UseDevelopmentStorage=true" in message


def test_the_cli_says_it_in_one_line(app, capsys, monkeypatch):
    from azure_functions_db.cli import EXIT_OK, main

    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    monkeypatch.setenv("AzureWebJobsStorage__blobServiceUri", "http://127.0.0.1:10000/x")
    monkeypatch.setenv("AFDB_STATE", "azure")
    assert main(["run", str(app), "--once"]) != EXIT_OK
    out, err = capsys.readouterr()
    failed = [line for line in out.splitlines() if "failed:" in line]
    assert len(failed) == 1
    assert "`AzureWebJobsStorage__blobServiceUri` is `http://127.0.0.1:10000/x`" in failed[0]
    assert "Traceback" not in out + err
