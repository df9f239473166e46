"""The Blob state store on Azurite through ``devkit/latency_proxy.py`` (the benchmarks'
Azure-like latency): every call works, and none is faster than one delayed round trip."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.errors import CheckpointConflictError
from azure_functions_db.state.blob import BlobStateStore
from devkit.azurite import Azurite
from devkit.latency_proxy import proxied_connection_string

T = TypeVar("T")
DELAY = 0.05


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_blob_state_store_checkpoints_through_the_latency_proxy(
    azurite: Azurite, azurite_container: str
) -> None:
    key = PollerKey("latency", "proxied")
    with proxied_connection_string(azurite.connection_string, DELAY) as connection_string:
        assert f":{azurite.blob_port}/" not in connection_string
        store = BlobStateStore(
            settings={"AzureWebJobsStorage": connection_string}, container=azurite_container
        )
        try:
            first = Checkpoint(key).fenced(1)
            etag, seconds = _timed(lambda: store.create(first))
            assert seconds >= 2 * DELAY  # creates the container too: more than one round trip

            found, seconds = _timed(lambda: store.read(key))
            assert seconds >= 2 * DELAY
            assert found is not None
            assert (found.checkpoint, found.etag) == (first, etag)

            second = first.fenced(2)
            new_etag, seconds = _timed(lambda: store.replace(second, etag))
            assert seconds >= 2 * DELAY
            assert new_etag != etag

            with pytest.raises(CheckpointConflictError):  # the conditional PUT is conditional
                store.replace(first.fenced(3), etag)

            found = store.read(key)
            assert found is not None
            assert (found.checkpoint, found.etag) == (second, new_etag)
        finally:
            store.container.close()
    # Straight to Azurite (no proxy) the same record is there.
    direct = BlobStateStore(
        settings={"AzureWebJobsStorage": azurite.connection_string}, container=azurite_container
    )
    try:
        found = direct.read(key)
        assert found is not None
        assert found.etag == new_etag
    finally:
        direct.container.close()
