"""The state-store contract, unchanged, over the Blob and Table stores on a real Azurite.

Azure decides lease expiry on its own clock, so time passes by really sleeping (leases of the
minimum 15 s); the two tests that need an exact instant cannot apply and say so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import StateStore
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.table import TableStateStore, quarantine_table_name
from azure_functions_db.testing import GARBAGE, StateStoreContract
from azure_functions_db.testing.clock import FakeClock
from devkit.azurite import Azurite


class AzureHarness(StateStoreContract):
    controllable_clock = False
    lease_duration = 15.0
    clock_slack = 1.5
    racers = 4

    @pytest.fixture(autouse=True)
    def _azure(self, azurite: Azurite, azurite_container: str, azurite_table_name: str) -> None:
        self.settings = {"AzureWebJobsStorage": azurite.connection_string}
        self.container = azurite_container
        self.table_name = azurite_table_name

    def advance(self, clock: FakeClock, seconds: float) -> None:
        time.sleep(seconds)
        clock.advance(seconds)


@pytest.mark.slow
class TestBlobStateStore(AzureHarness):
    def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        return BlobStateStore(settings=self.settings, container=self.container)

    def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
        assert isinstance(store, BlobStateStore)
        with contextlib.suppress(ResourceExistsError):
            store.container.create_container()
        blob = store.container.get_blob_client(BlobStateStore.checkpoint_name(key))
        blob.upload_blob(data, overwrite=True)

    def corrupt_quarantined(
        self, store: StateStore, key: PollerKey, record_id: str, data: bytes = GARBAGE
    ) -> None:
        assert isinstance(store, BlobStateStore)
        store.write_quarantined_raw(key, record_id, data)

    def reopen(self, store: StateStore) -> StateStore:
        return BlobStateStore(settings=self.settings, container=self.container)


@pytest.mark.slow
class TestTableStateStore(AzureHarness):
    def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        return TableStateStore(
            settings=self.settings, table=self.table_name, lease_container=self.container
        )

    def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
        assert isinstance(store, TableStateStore)
        # A table string cannot hold NUL: drop it; the record is just as undecodable without.
        store.write_raw(key, data.decode("utf-8", "replace").replace("\x00", ""))

    def corrupt_quarantined(
        self, store: StateStore, key: PollerKey, record_id: str, data: bytes = GARBAGE
    ) -> None:
        assert isinstance(store, TableStateStore)
        store.write_quarantined_raw(key, record_id, data)  # binary properties: NUL and all

    def reopen(self, store: StateStore) -> StateStore:
        return TableStateStore(
            settings=self.settings, table=self.table_name, lease_container=self.container
        )

    @pytest.fixture(autouse=True)
    def _drop_quarantine_table(self, azurite: Azurite) -> Iterator[None]:
        # The shared fixture deletes the checkpoint table only.
        yield
        azurite.ensure_running()
        name = quarantine_table_name(self.table_name)
        with (
            TableServiceClient.from_connection_string(azurite.connection_string) as service,
            contextlib.suppress(ResourceNotFoundError),
        ):
            service.delete_table(name)
