"""The Azurite fixtures work against the real emulator, and what Azurite does (SPEC §10) is
recorded here as tests: the Blob and Table stores are built on exactly these behaviours.

Error codes are compared as strings: the SDKs hand back ``StorageErrorCode``/``TableErrorCode``
enum members (``str`` subclasses) when they parse one, ``None`` when they do not.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from azure.storage.blob import BlobClient, BlobLeaseClient, BlobServiceClient, ContainerClient

from devkit.azurite import (
    ACCOUNT_NAME,
    AZURITE_DIR,
    REPO,
    Azurite,
    AzuriteError,
    installed_version,
    pinned_version,
    unavailable_reason,
)


@pytest.fixture
def container(azurite: Azurite, azurite_container: str) -> Iterator[ContainerClient]:
    with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        client = service.get_container_client(azurite_container)
        client.create_container()
        yield client


@pytest.fixture
def blob(container: ContainerClient) -> BlobClient:
    client = container.get_blob_client("record.json")
    client.upload_blob(b'{"v": 1}')
    return client


@pytest.fixture
def table(azurite: Azurite, azurite_table_name: str) -> Iterator[TableClient]:
    with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        yield service.create_table(azurite_table_name)


def _content(blob: BlobClient) -> bytes:
    return blob.download_blob().readall()


def _server_header(endpoint: str) -> str:
    """The ``Server`` header of an anonymous request (Azurite answers it with an error)."""
    try:
        with urllib.request.urlopen(f"{endpoint}?comp=list", timeout=10) as response:
            return str(response.headers["Server"])
    except urllib.error.HTTPError as exc:
        with exc:
            return str(exc.headers["Server"])


# -- the fixtures ---------------------------------------------------------------------------------


def test_azurite_is_pinned_to_an_exact_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned_version()), "pin an exact version"
    lock = json.loads((AZURITE_DIR / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/azurite"]["version"] == pinned_version()


def test_the_fixture_runs_the_pinned_version(azurite: Azurite) -> None:
    assert installed_version() == pinned_version()
    assert f"Azurite-Blob/{pinned_version()}" in _server_header(azurite.blob_endpoint)


def test_connection_string_names_every_endpoint_on_loopback(azurite: Azurite) -> None:
    assert azurite.blob_endpoint == f"http://127.0.0.1:{azurite.blob_port}/{ACCOUNT_NAME}"
    assert azurite.table_endpoint == f"http://127.0.0.1:{azurite.table_port}/{ACCOUNT_NAME}"
    assert azurite.queue_endpoint == f"http://127.0.0.1:{azurite.queue_port}/{ACCOUNT_NAME}"
    assert len({azurite.blob_port, azurite.table_port, azurite.queue_port}) == 3
    parts = dict(part.split("=", 1) for part in azurite.connection_string.rstrip(";").split(";"))
    assert parts["DefaultEndpointsProtocol"] == "http"
    assert parts["AccountName"] == ACCOUNT_NAME
    assert parts["BlobEndpoint"] == azurite.blob_endpoint
    assert parts["TableEndpoint"] == azurite.table_endpoint
    assert parts["QueueEndpoint"] == azurite.queue_endpoint  # the QueueSink's


def test_blob_round_trip(azurite: Azurite, azurite_container: str) -> None:
    assert re.fullmatch(r"t-[0-9a-f]{12}", azurite_container)
    with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        assert service.url.rstrip("/") == azurite.blob_endpoint
        container = service.create_container(azurite_container)
        container.upload_blob("a", b"hello")
        assert _content(container.get_blob_client("a")) == b"hello"
        assert azurite_container in [c.name for c in service.list_containers()]


def test_table_round_trip(azurite: Azurite, azurite_table_name: str) -> None:
    assert re.fullmatch(r"t[0-9a-f]{12}", azurite_table_name)
    with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        assert service.url.rstrip("/") == azurite.table_endpoint
        with service.create_table(azurite_table_name) as table:
            table.create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
            assert table.get_entity("p", "r")["v"] == 1


def test_names_are_unique_per_test(azurite_container: str, azurite_table_name: str) -> None:
    assert azurite_container[2:] != azurite_table_name[1:]


def test_container_cleanup_breaks_a_container_lease(container: ContainerClient) -> None:
    # The fixture's teardown must still delete this container.
    BlobLeaseClient(container).acquire(lease_duration=-1)


def test_tests_without_azurite_get_no_marker(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("azurite") is None


def test_the_azurite_marker_is_applied(
    request: pytest.FixtureRequest, azurite_container: str
) -> None:
    assert request.node.get_closest_marker("azurite") is not None


def test_log_file_is_in_the_data_directory(azurite: Azurite) -> None:
    assert azurite.log_path.parent == azurite.location
    assert "Blob service is successfully listening" in azurite.log_path.read_text()


# -- lifecycle: restart keeps the data; kill, pause ----------------------------------------------


def test_restart_keeps_data_ports_and_clients(
    azurite: Azurite, azurite_container: str, azurite_table_name: str
) -> None:
    ports = (azurite.blob_port, azurite.table_port)
    pid = azurite.pid
    with (
        BlobServiceClient.from_connection_string(azurite.connection_string) as blobs,
        TableServiceClient.from_connection_string(azurite.connection_string) as tables,
    ):
        blobs.create_container(azurite_container).upload_blob("kept", b"before restart")
        with tables.create_table(azurite_table_name) as table:
            table.create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})

        azurite.restart()

        assert (azurite.blob_port, azurite.table_port) == ports
        assert azurite.pid != pid
        # The clients made before the restart still work: same ports, same account.
        blob = blobs.get_blob_client(azurite_container, "kept")
        assert _content(blob) == b"before restart"
        with tables.get_table_client(azurite_table_name) as table:
            assert table.get_entity("p", "r")["v"] == 1


def test_kill_then_start_serves_what_was_saved(private_azurite: Azurite) -> None:
    # SIGKILL loses what Azurite's metadata store (LokiJS, autosaved every 5 s) has not saved
    # yet; a graceful restart saves it, so the container below survives the kill.
    with BlobServiceClient.from_connection_string(private_azurite.connection_string) as service:
        service.create_container("saved").upload_blob("b", b"x")
        private_azurite.restart()
        pid = private_azurite.pid
        private_azurite.kill()
        assert not private_azurite.running
        assert pid is not None
        assert not _alive(pid)
        private_azurite.start()
        assert _content(service.get_blob_client("saved", "b")) == b"x"


def test_paused_azurite_times_out_requests_until_resumed(private_azurite: Azurite) -> None:
    with BlobServiceClient.from_connection_string(
        private_azurite.connection_string, connection_timeout=2, read_timeout=1, retry_total=0
    ) as service:
        container = service.create_container("c-pause")
        private_azurite.pause()
        try:
            assert private_azurite.paused
            with pytest.raises(ServiceResponseError):
                container.get_container_properties()
        finally:
            private_azurite.resume()
    # Served again; asked with the default timeouts and retries (a loaded machine can take more
    # than the 1 s above to get a resumed Azurite answering).
    with BlobServiceClient.from_connection_string(private_azurite.connection_string) as service:
        properties = service.get_container_client("c-pause").get_container_properties()
        assert properties.name == "c-pause"


def test_a_taken_port_is_a_clear_error_on_restart(private_azurite: Azurite) -> None:
    private_azurite.stop()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", private_azurite.table_port))
        squatter.listen()
        with pytest.raises(AzuriteError) as raised:
            private_azurite.start()
    message = str(raised.value)
    assert "EADDRINUSE" in message
    assert str(private_azurite.log_path) in message
    assert not private_azurite.running


@pytest.mark.azurite
def test_first_start_moves_off_a_taken_port(tmp_path: Path) -> None:
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    azurite = Azurite(tmp_path / "azurite")
    taken = azurite.table_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with azurite:
            assert azurite.table_port != taken
            assert azurite.running


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


ORPHAN = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from devkit.azurite import Azurite
azurite = Azurite(Path({location!r})).start()
print(azurite.pid, flush=True)
if {crash!r}:
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.azurite
@pytest.mark.parametrize("crash", [False, True], ids=["exit-without-stop", "sigkill"])
def test_azurite_dies_with_the_test_process(tmp_path: Path, crash: bool) -> None:
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    script = ORPHAN.format(repo=str(REPO), location=str(tmp_path / "azurite"), crash=crash)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == (-9 if crash else 0), result.stderr
    pid = int(result.stdout.strip())
    assert _wait_dead(pid), f"Azurite (pid {pid}) outlived the process that started it"


# -- Blob: conditional writes ---------------------------------------------------------------------


def test_stale_etag_is_412_condition_not_met(blob: BlobClient) -> None:
    stale = blob.get_blob_properties().etag
    blob.upload_blob(b'{"v": 2}', overwrite=True)
    with pytest.raises(ResourceModifiedError) as raised:
        blob.upload_blob(
            b'{"v": 3}', overwrite=True, etag=stale, match_condition=MatchConditions.IfNotModified
        )
    assert raised.value.status_code == 412
    assert raised.value.error_code == "ConditionNotMet"
    assert _content(blob) == b'{"v": 2}'


@pytest.mark.parametrize(
    "kwargs",
    [{"overwrite": False}, {"overwrite": True, "match_condition": MatchConditions.IfMissing}],
    ids=["overwrite-false", "if-missing"],
)
def test_create_only_refuses_an_existing_blob(blob: BlobClient, kwargs: dict[str, object]) -> None:
    with pytest.raises(ResourceExistsError) as raised:
        blob.upload_blob(b"second", **kwargs)
    assert raised.value.status_code == 409
    assert raised.value.error_code == "BlobAlreadyExists"
    assert _content(blob) == b'{"v": 1}'


def test_create_only_with_if_missing_creates_a_missing_blob(container: ContainerClient) -> None:
    fresh = container.get_blob_client("fresh")
    fresh.upload_blob(b"new", overwrite=True, match_condition=MatchConditions.IfMissing)
    assert _content(fresh) == b"new"


def test_if_missing_with_an_etag_crashes_client_side(blob: BlobClient) -> None:
    # azure-storage-blob sends `etag` on to the HTTP session when the condition is IfMissing.
    etag = blob.get_blob_properties().etag
    with pytest.raises(TypeError, match="etag"):
        blob.upload_blob(b"x", overwrite=True, etag=etag, match_condition=MatchConditions.IfMissing)


# -- Blob: leases ---------------------------------------------------------------------------------


def test_write_to_a_leased_blob_without_the_lease_is_412_lease_id_missing(
    blob: BlobClient,
) -> None:
    BlobLeaseClient(blob).acquire(lease_duration=15)
    with pytest.raises(HttpResponseError) as raised:
        blob.upload_blob(b"intruder", overwrite=True)
    assert type(raised.value) is HttpResponseError
    assert raised.value.status_code == 412
    assert raised.value.error_code == "LeaseIdMissing"
    with pytest.raises(HttpResponseError) as raised:
        blob.set_blob_metadata({"fence": "9"})
    assert raised.value.error_code == "LeaseIdMissing"


def test_write_with_a_wrong_lease_id_is_412_lease_id_mismatch(blob: BlobClient) -> None:
    BlobLeaseClient(blob).acquire(lease_duration=15)
    with pytest.raises(HttpResponseError) as raised:
        blob.set_blob_metadata({"fence": "9"}, lease=str(uuid.uuid4()))
    assert type(raised.value) is HttpResponseError
    assert raised.value.status_code == 412
    assert raised.value.error_code == "LeaseIdMismatchWithBlobOperation"


def test_second_acquire_is_409_lease_already_present(blob: BlobClient) -> None:
    BlobLeaseClient(blob).acquire(lease_duration=15)
    with pytest.raises(ResourceExistsError) as raised:
        BlobLeaseClient(blob).acquire(lease_duration=15)
    assert raised.value.status_code == 409
    assert raised.value.error_code == "LeaseAlreadyPresent"


def test_acquiring_a_lease_keeps_the_etag(blob: BlobClient) -> None:
    before = blob.get_blob_properties().etag
    lease = BlobLeaseClient(blob)
    lease.acquire(lease_duration=15)
    assert blob.get_blob_properties().etag == before
    assert lease.etag == before
    lease.renew()
    assert blob.get_blob_properties().etag == before


def test_metadata_with_lease_and_etag_rotates_the_etag(blob: BlobClient) -> None:
    lease = BlobLeaseClient(blob)
    lease.acquire(lease_duration=15)
    etag = blob.get_blob_properties().etag
    written = blob.set_blob_metadata(
        {"fence": "1"}, lease=lease, etag=etag, match_condition=MatchConditions.IfNotModified
    )
    properties = blob.get_blob_properties()
    assert properties.metadata == {"fence": "1"}
    assert written["etag"] == properties.etag != etag
    assert properties.lease.state == "leased"  # the write kept the lease
    with pytest.raises(ResourceModifiedError) as raised:
        blob.set_blob_metadata(
            {"fence": "2"}, lease=lease, etag=etag, match_condition=MatchConditions.IfNotModified
        )
    assert raised.value.error_code == "ConditionNotMet"


@pytest.mark.parametrize("seconds", [15, 60, -1])
def test_lease_durations_azurite_accepts(blob: BlobClient, seconds: int) -> None:
    lease = BlobLeaseClient(blob)
    lease.acquire(lease_duration=seconds)
    expected = "infinite" if seconds == -1 else "fixed"
    assert blob.get_blob_properties().lease.duration == expected
    lease.release()


@pytest.mark.parametrize("seconds", [0, 1, 14, 61])
def test_lease_durations_azurite_refuses(blob: BlobClient, seconds: int) -> None:
    # Like Azure: 15-60 s or infinite (-1). Expiry tests therefore take 15 s.
    with pytest.raises(HttpResponseError) as raised:
        BlobLeaseClient(blob).acquire(lease_duration=seconds)
    assert raised.value.status_code == 400
    assert raised.value.error_code == "InvalidHeaderValue"


def test_renew_after_release_is_409_lease_id_mismatch(blob: BlobClient) -> None:
    lease = BlobLeaseClient(blob)
    lease.acquire(lease_duration=15)
    lease_id = lease.id
    lease.release()
    # The SDK forgets the id on release (the response carries none): renewing with the same
    # client object fails before any request is sent.
    assert lease.id is None
    with pytest.raises(ValueError, match="No value for given attribute"):
        lease.renew()
    # With the id kept, Azurite refuses: a released lease cannot be renewed.
    with pytest.raises(ResourceExistsError) as raised:
        BlobLeaseClient(blob, lease_id=lease_id).renew()
    assert raised.value.status_code == 409
    assert raised.value.error_code == "LeaseIdMismatchWithLeaseOperation"
    assert blob.get_blob_properties().lease.state == "available"


@pytest.mark.slow
def test_renew_after_expiry(container: ContainerClient) -> None:
    """One 15 s expiry, three blobs: an expired lease nobody touched renews (same id, same etag);
    after the blob was written, or leased by someone else, the renewal is refused."""
    blobs = {name: container.get_blob_client(name) for name in ("idle", "written", "taken")}
    leases = {}
    for name, client in blobs.items():
        client.upload_blob(b"v1")
        leases[name] = BlobLeaseClient(client)
        leases[name].acquire(lease_duration=15)
    etags = {name: client.get_blob_properties().etag for name, client in blobs.items()}
    deadline = time.monotonic() + 20
    for client in blobs.values():
        while client.get_blob_properties().lease.state != "expired":
            assert time.monotonic() < deadline, "a 15 s lease did not expire within 20 s"
            time.sleep(0.2)

    idle = leases["idle"]
    lease_id = idle.id
    idle.renew()
    assert idle.id == lease_id
    properties = blobs["idle"].get_blob_properties()
    assert (properties.lease.state, properties.lease.duration) == ("leased", "fixed")
    assert properties.etag == etags["idle"]

    blobs["written"].upload_blob(b"v2", overwrite=True)  # an expired lease guards nothing
    other = BlobLeaseClient(blobs["taken"])
    other.acquire(lease_duration=15)
    for name in ("written", "taken"):
        with pytest.raises(ResourceExistsError) as raised:
            leases[name].renew()
        assert raised.value.status_code == 409
        assert raised.value.error_code == "LeaseIdMismatchWithLeaseOperation"
    assert blobs["written"].get_blob_properties().lease.state == "available"  # cleared by the write
    assert blobs["taken"].get_blob_properties().lease.state == "leased"


# -- Table ----------------------------------------------------------------------------------------


def test_table_stale_etag_is_412_update_condition_not_satisfied(table: TableClient) -> None:
    stale = table.create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})["etag"]
    fresh = table.update_entity(
        {"PartitionKey": "p", "RowKey": "r", "v": 2},
        mode=UpdateMode.REPLACE,
        etag=stale,
        match_condition=MatchConditions.IfNotModified,
    )["etag"]
    assert fresh != stale
    for mode in (UpdateMode.REPLACE, UpdateMode.MERGE):
        with pytest.raises(ResourceModifiedError) as raised:
            table.update_entity(
                {"PartitionKey": "p", "RowKey": "r", "v": 3},
                mode=mode,
                etag=stale,
                match_condition=MatchConditions.IfNotModified,
            )
        assert raised.value.status_code == 412
        assert raised.value.error_code == "UpdateConditionNotSatisfied"
    assert table.get_entity("p", "r")["v"] == 2


def test_table_create_entity_is_create_only(table: TableClient) -> None:
    table.create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
    with pytest.raises(ResourceExistsError) as raised:
        table.create_entity({"PartitionKey": "p", "RowKey": "r", "v": 2})
    assert raised.value.status_code == 409
    # azure-data-tables re-raises this one undecoded: no `error_code` attribute, so the code is
    # read from the response header.
    assert raised.value.response is not None
    assert raised.value.response.headers["x-ms-error-code"] == "EntityAlreadyExists"
    assert table.get_entity("p", "r")["v"] == 1


# -- Development storage shortcut -----------------------------------------------------------------


def test_use_development_storage_means_the_default_loopback_ports() -> None:
    # Only constructed, never called: nothing listens on the default ports in tests.
    with BlobServiceClient.from_connection_string("UseDevelopmentStorage=true") as blobs:
        assert blobs.url == "http://127.0.0.1:10000/devstoreaccount1/"
        assert blobs.account_name == ACCOUNT_NAME
    with TableServiceClient.from_connection_string("UseDevelopmentStorage=true") as tables:
        assert tables.url == "http://127.0.0.1:10002/devstoreaccount1"
