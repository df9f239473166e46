"""The requests a Blob lease costs on a poller's first run, on a real Azurite: the container is
created as soon as the service says it is missing, and the fence of a lease blob the acquire
just created is raised without reading it first, unless somebody wrote it in between."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.pipeline import PipelineResponse

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.state.blob import BlobStateStore
from devkit.azurite import Azurite

KEY = PollerKey(poller="orders", namespace="live")

pytestmark = pytest.mark.slow


class Requests:
    """Every request of one client, as ``METHOD status comp``."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def options(self) -> dict[str, Any]:
        return {"raw_response_hook": self.on_response}

    def on_response(self, response: PipelineResponse[Any, Any]) -> None:
        request = response.http_request
        query = request.url.partition("?")[2]
        comp = next(
            (part.partition("=")[2] for part in query.split("&") if part.startswith("comp=")), ""
        )
        restype = "container" if "restype=container" in query else ""
        self.seen.append(
            f"{request.method} {response.http_response.status_code} {comp or restype}".strip()
        )


def store(azurite: Azurite, container: str, requests: Requests | None = None) -> BlobStateStore:
    return BlobStateStore(
        settings={"AzureWebJobsStorage": azurite.connection_string},
        container=container,
        client_options=requests.options() if requests is not None else None,
    )


def test_a_first_acquire_in_a_new_container_costs_five_requests(
    azurite: Azurite, azurite_container: str
) -> None:
    requests = Requests()
    grant = store(azurite, azurite_container, requests).acquire(KEY, "owner-a", 15)
    assert grant is not None
    assert grant.fence == 1
    assert requests.seen == [
        "PUT 404 lease",  # acquire: ContainerNotFound
        "PUT 201 container",  # create the container at once
        "PUT 201",  # create the lease blob, fence 0
        "PUT 201 lease",  # acquire
        "PUT 200 metadata",  # fence 1, on the etag the blob was created with
    ]
    info = store(azurite, azurite_container).inspect(KEY)
    assert (info.state, info.fence, info.holder) == ("held", 1, "owner-a")


def test_a_later_acquire_reads_the_fence_and_raises_it(
    azurite: Azurite, azurite_container: str
) -> None:
    first = store(azurite, azurite_container)
    grant = first.acquire(KEY, "owner-a", 15)
    assert grant is not None
    first.release(grant)
    requests = Requests()
    again = store(azurite, azurite_container, requests).acquire(KEY, "owner-b", 15)
    assert again is not None
    assert again.fence == 2
    assert requests.seen == ["PUT 201 lease", "HEAD 200", "PUT 200 metadata"]


def test_a_fence_raised_between_creating_the_lease_blob_and_acquiring_it_is_read(
    azurite: Azurite, azurite_container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Owner A creates the lease blob; before A's acquire, owner B acquires it, raises the fence
    to 1 and releases it. A's write on the etag it created the blob with is refused, so A reads
    the fence and takes 2, not 1 again (two owners with one fence would both pass the fence
    check)."""
    a, b = store(azurite, azurite_container), store(azurite, azurite_container)
    real = BlobStateStore._with_lease_blob

    def with_lease_blob(self: BlobStateStore, *args: Any, created: list[str], **kw: Any) -> Any:
        call = args[2]

        def b_first() -> Any:
            if created:  # A created the blob: B takes the lease once before A's acquire
                grant = b.acquire(KEY, "owner-b", 15)
                assert grant is not None
                assert grant.fence == 1
                b.release(grant)
            return call()

        return real(self, *args[:2], b_first, created=created, **kw)

    a.container.create_container()
    monkeypatch.setattr(BlobStateStore, "_with_lease_blob", with_lease_blob)
    # B's own acquire runs through the patched method too; it finds the blob, creates nothing.
    grant = a.acquire(KEY, "owner-a", 15)
    assert grant is not None
    assert grant.fence == 2
    assert a.inspect(KEY).fence == 2
