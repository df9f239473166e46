"""Checkpoints and fenced leases on Azure Blob Storage (the default state store in Azure).

Layout in one container (default ``afdb-state``), names percent-encoded::

    <namespace>/<poller>.lease             empty blob; holds the Azure blob lease;
                                           metadata: fence=<n>, owner=<who acquired last>
    <namespace>/<poller>.checkpoint.json   the checkpoint record; written only by etag CAS
    <namespace>/<poller>.quarantine/<id>.json
                                           a quarantine record (``encode_record`` bytes), one
                                           blob each: created with ``If-None-Match: *``,
                                           replaced only by etag CAS

Lease expiry is the service's (15-60 s, server side); no local clock is compared anywhere. The
fence is raised on every acquire by a metadata write that carries the new lease id *and*
``If-Match`` on the etag read under that lease, so two acquirers can never both raise it to the
same value. The container and the blobs are created on first use. A blob upload is atomic, so
a quarantine record of any size is whole or absent; ``list_keys`` sees checkpoints only (a
quarantine blob has a second ``/`` after the namespace).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar
from urllib.parse import unquote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import (
    BlobClient,
    BlobLeaseClient,
    BlobServiceClient,
    ContainerClient,
    ExponentialRetry,
)

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, encode_checkpoint
from azure_functions_db.core.ports import (
    LeaseGrant,
    LeaseInfo,
    StoredCheckpoint,
    StoredQuarantine,
)
from azure_functions_db.core.quarantine import QuarantineRecord, encode_record
from azure_functions_db.errors import (
    ConfigurationError,
    LeaseLostError,
    RecordExistsError,
)
from azure_functions_db.state import _common
from azure_functions_db.state._blob_fence import fence_of, lease_seconds, raise_fence
from azure_functions_db.state.storage import (
    CLIENT_OPTIONS,
    DEFAULT_CONNECTION,
    creating_parent,
    encode_name,
    error_code,
    resolve_storage,
    translate_error,
    translated,
)

T = TypeVar("T")

_BLOB = "Blob"

_CHECKPOINT = ".checkpoint.json"
_LEASE = ".lease"
_QUARANTINE = ".quarantine/"
_RECORD = ".json"
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_LOST_CODES = frozenset(
    {
        "LeaseIdMismatchWithLeaseOperation",
        "LeaseNotPresentWithLeaseOperation",
        "LeaseIdMismatchWithBlobOperation",
        "LeaseLost",
        "LeaseIsBrokenAndCannotBeRenewed",
        "LeaseIsBreakingAndCannotBeAcquired",
    }
)


def _retry_policy() -> ExponentialRetry:
    # The SDK waits initial_backoff + increment_base**n (n = 1, 2), +-1 s: about 2 s, then 4 s,
    # so a retried call gives up well inside a 15 s lease; the engine retries whole operations
    # on top, and a renewal that keeps failing ends with the lease counted lost (the fence
    # keeps even a slow one safe).
    return ExponentialRetry(
        initial_backoff=0, increment_base=2, retry_total=2, random_jitter_range=1
    )


class BlobStateStore:
    """Checkpoints, leases and quarantine records in an Azure Blob container; see the module
    docstring for layout.

    Args:
        connection: Name of the app setting holding the storage connection, read at first use
            (``AzureWebJobsStorage`` by default: a connection string, or the identity-based
            ``AzureWebJobsStorage__accountName`` / ``__blobServiceUri`` settings).
        container: Container for state; created on first use. 3-63 lowercase letters, digits
            and hyphens.
        settings: Where to read ``connection`` from; default: the environment, at first use.
        client: A ready ``BlobServiceClient`` (overrides ``connection``).
        client_options: Extra keyword arguments for the ``BlobServiceClient`` (timeouts,
            ``retry_policy``, ``raw_request_hook``/``raw_response_hook``). The storage SDK
            ignores ``per_call_policies``: hook into requests with the raw hooks instead.
    """

    def __init__(
        self,
        connection: str = DEFAULT_CONNECTION,
        *,
        container: str = "afdb-state",
        settings: Mapping[str, str] | None = None,
        client: BlobServiceClient | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _CONTAINER_NAME.match(container):
            raise ConfigurationError(
                f"Invalid container name `{container}`: use 3-63 lowercase letters, digits and "
                'single hyphens, starting with a letter or digit (e.g. `container="afdb-state"`).'
            )
        if not connection or not isinstance(connection, str):
            raise ConfigurationError(
                f"`connection={connection!r}` must name an app setting, e.g. "
                '`connection="AzureWebJobsStorage"`.'
            )
        self._connection = connection
        self._container_name = container
        self._settings = settings
        self._client = client
        self._client_options = dict(client_options or {})
        self._container: ContainerClient | None = None
        self._records: dict[str, BlobClient] = {}  # checkpoint and lease blobs, by name
        self._account = client.account_name if client is not None else None

    # -- clients -----------------------------------------------------------------------------

    @property
    def container(self) -> ContainerClient:
        """The container client, created from settings at first use."""
        if self._container is None:
            service = self._client or self._make_client()
            self._account = service.account_name
            self._container = service.get_container_client(self._container_name)
        return self._container

    def _make_client(self) -> BlobServiceClient:
        target = resolve_storage(
            os.environ if self._settings is None else self._settings, self._connection
        )
        options = {"retry_policy": _retry_policy(), **CLIENT_OPTIONS, **self._client_options}
        if target.connection_string is not None:
            return BlobServiceClient.from_connection_string(target.connection_string, **options)
        if target.blob_url is None:
            raise ConfigurationError(
                f"Set `{target.setting}__accountName` or `{target.setting}__blobServiceUri` for "
                "the Blob state store."
            )
        return BlobServiceClient(target.blob_url, credential=target.credential, **options)

    def _blob(self, name: str) -> BlobClient:
        """The client of blob ``name``; made once for checkpoint and lease blobs (written on
        every commit and renewal: a new client is a tenth of a commit's client CPU)."""
        client = self._records.get(name)
        if client is None:
            client = self.container.get_blob_client(name)
            if name.endswith((_CHECKPOINT, _LEASE)):
                self._records[name] = client
        return client

    @staticmethod
    def checkpoint_name(key: PollerKey) -> str:
        """Blob name of the checkpoint record of ``key``."""
        return f"{encode_name(key.namespace)}/{encode_name(key.poller)}{_CHECKPOINT}"

    @staticmethod
    def lease_name(key: PollerKey) -> str:
        """Blob name of the lease blob of ``key``."""
        return f"{encode_name(key.namespace)}/{encode_name(key.poller)}{_LEASE}"

    @staticmethod
    def quarantine_prefix(key: PollerKey) -> str:
        """Name prefix of the quarantine records of ``key`` (it ends with ``/``)."""
        return f"{encode_name(key.namespace)}/{encode_name(key.poller)}{_QUARANTINE}"

    @classmethod
    def quarantine_name(cls, key: PollerKey, record_id: str) -> str:
        """Blob name of quarantine record ``record_id`` of ``key``."""
        return f"{cls.quarantine_prefix(key)}{encode_name(record_id)}{_RECORD}"

    # -- CheckpointStore ---------------------------------------------------------------------

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.read`."""
        found = self._download(self.checkpoint_name(key))
        if found is None:
            return None
        data, etag = found
        return StoredCheckpoint(_common.decode_record(key, data), etag)

    def create(self, checkpoint: Checkpoint) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.create`."""
        key = checkpoint.key
        data = encode_checkpoint(checkpoint)
        blob = self._blob(self.checkpoint_name(key))
        try:
            result = self._in_container(
                lambda: blob.upload_blob(data, overwrite=False), "create the checkpoint of", key
            )
        except ResourceExistsError as exc:
            raise RecordExistsError(key.poller, key.namespace) from exc
        return str(result["etag"])

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.replace`."""
        key = checkpoint.key
        data = encode_checkpoint(checkpoint)
        blob = self._blob(self.checkpoint_name(key))
        try:
            with translated(_BLOB, "write the checkpoint of", key):
                result = blob.upload_blob(
                    data, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            found = self._download(self.checkpoint_name(key))
            found_etag, found_data = (found[1], found[0]) if found else (None, None)
            raise _common.conflict(checkpoint, etag, found_etag, found_data) from exc
        return str(result["etag"])

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.list_keys`."""
        prefix = f"{encode_name(namespace)}/" if namespace is not None else None
        keys: list[PollerKey] = []
        try:
            with translated(_BLOB, "list", None):
                names = [b.name for b in self.container.list_blobs(name_starts_with=prefix)]
        except ResourceNotFoundError:
            return []
        for name in names:
            ns, _, rest = name.partition("/")
            if rest.endswith(_CHECKPOINT) and "/" not in rest:
                keys.append(PollerKey(unquote(ns), unquote(rest[: -len(_CHECKPOINT)])))
        return sorted(keys, key=lambda k: (k.namespace, k.poller))

    # -- QuarantineStore ---------------------------------------------------------------------

    def put_quarantined(self, record: QuarantineRecord) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.put_quarantined`."""
        data = encode_record(record)
        blob = self._blob(self.quarantine_name(record.key, record.id))
        try:
            result = self._in_container(
                lambda: blob.upload_blob(data, overwrite=False),
                f"create quarantine record `{record.id}` of",
                record.key,
            )
        except ResourceExistsError as exc:
            raise _common.quarantine_exists(record) from exc
        return str(result["etag"])

    def read_quarantined(self, key: PollerKey, record_id: str) -> StoredQuarantine | None:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.read_quarantined`."""
        found = self._download(self.quarantine_name(key, record_id))
        if found is None:
            return None
        data, etag = found
        return StoredQuarantine(_common.decode_quarantined(key, record_id, data), etag)

    def replace_quarantined(self, record: QuarantineRecord, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.replace_quarantined`."""
        data = encode_record(record)
        blob = self._blob(self.quarantine_name(record.key, record.id))
        try:
            with translated(_BLOB, f"write quarantine record `{record.id}` of", record.key):
                result = blob.upload_blob(
                    data, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            try:
                with translated(_BLOB, f"read quarantine record `{record.id}` of", record.key):
                    found: str | None = str(blob.get_blob_properties().etag)
            except ResourceNotFoundError:
                found = None
            raise _common.quarantine_conflict(record, etag, found) from exc
        return str(result["etag"])

    def list_quarantined(self, key: PollerKey) -> Sequence[str]:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.list_quarantined`."""
        prefix = self.quarantine_prefix(key)
        try:
            with translated(_BLOB, "list the quarantine records of", key):
                names = [b.name for b in self.container.list_blobs(name_starts_with=prefix)]
        except ResourceNotFoundError:
            return []
        ids = [
            unquote(rest[: -len(_RECORD)])
            for rest in (name[len(prefix) :] for name in names)
            if rest.endswith(_RECORD) and "/" not in rest
        ]
        return sorted(ids)

    def write_quarantined_raw(self, key: PollerKey, record_id: str, data: bytes) -> str:
        """Store ``data`` as quarantine record ``record_id`` of ``key`` unconditionally; its
        etag. For tests and repair tools only: an out-of-band writer (a bad restore, a bug)."""
        blob = self._blob(self.quarantine_name(key, record_id))
        result = self._in_container(
            lambda: blob.upload_blob(bytes(data), overwrite=True),
            f"write quarantine record `{record_id}` of",
            key,
        )
        return str(result["etag"])

    # -- LeaseManager ------------------------------------------------------------------------

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.acquire`."""
        seconds = lease_seconds(duration)
        blob = self._blob(self.lease_name(key))
        lease = BlobLeaseClient(blob, lease_id=str(uuid.uuid4()))
        created: list[str] = []  # the etag of the lease blob, when this call created it
        try:
            self._with_lease_blob(
                blob, key, lambda: lease.acquire(lease_duration=seconds), created=created
            )
        except ResourceExistsError:
            return None  # LeaseAlreadyPresent: a live lease is held by someone else
        except HttpResponseError as exc:
            if error_code(exc) == "LeaseIsBreakingAndCannotBeAcquired":
                return None
            raise translate_error(exc, _BLOB, "acquire the lease of", key) from exc
        except AzureError as exc:
            raise translate_error(exc, _BLOB, "acquire the lease of", key) from exc
        try:
            with translated(_BLOB, "raise the fence of", key):
                fence = raise_fence(blob, lease, key, owner, created[0] if created else None)
        except BaseException:
            _quietly(lease.release)
            raise
        return LeaseGrant(key=key, lease_id=lease.id, owner=owner, fence=fence, duration=seconds)

    def renew(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.renew`."""
        lease = BlobLeaseClient(self._blob(self.lease_name(grant.key)), lease_id=grant.lease_id)
        try:
            lease.renew()
        except ResourceNotFoundError as exc:
            raise _lost(grant, "the lease blob is gone") from exc
        except HttpResponseError as exc:
            if exc.status_code == 409 or error_code(exc) in _LOST_CODES:
                raise _lost(grant, f"renewal refused ({error_code(exc)})") from exc
            raise translate_error(exc, _BLOB, "renew the lease of", grant.key) from exc
        except AzureError as exc:
            raise translate_error(exc, _BLOB, "renew the lease of", grant.key) from exc

    def release(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.release`."""
        lease = BlobLeaseClient(self._blob(self.lease_name(grant.key)), lease_id=grant.lease_id)
        try:
            lease.release()
        except ResourceNotFoundError:
            return
        except HttpResponseError as exc:
            if exc.status_code == 409 or error_code(exc) in _LOST_CODES:
                return  # another owner has it: nothing of ours to release
            raise translate_error(exc, _BLOB, "release the lease of", grant.key) from exc
        except AzureError as exc:
            raise translate_error(exc, _BLOB, "release the lease of", grant.key) from exc

    def inspect(self, key: PollerKey) -> LeaseInfo:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.inspect`.

        ``holder`` is the owner recorded by the latest acquire; the expiry time is the
        service's and is not exposed (``expires_at`` is ``None``).
        """
        blob = self._blob(self.lease_name(key))
        try:
            with translated(_BLOB, "inspect the lease of", key):
                props = blob.get_blob_properties()
        except ResourceNotFoundError:
            return LeaseInfo(key=key, state="free", holder=None, fence=0)
        fence = fence_of(props.metadata, key)
        if props.lease.status == "locked":
            return LeaseInfo(key=key, state="held", holder=props.metadata.get("owner"), fence=fence)
        return LeaseInfo(key=key, state="free", holder=None, fence=fence)

    # -- StateStore --------------------------------------------------------------------------

    def describe(self) -> str:
        """``blob:<account>/<container>`` (no secrets)."""
        account = self._account
        if account is None:
            try:
                account = resolve_storage(
                    os.environ if self._settings is None else self._settings, self._connection
                ).account
            except ConfigurationError:
                account = f"%{self._connection}%"
        return f"blob:{account}/{self._container_name}"

    def __repr__(self) -> str:
        return (
            f"BlobStateStore(connection={self._connection!r}, container={self._container_name!r})"
        )

    # -- internals ---------------------------------------------------------------------------

    def _download(self, name: str) -> tuple[bytes, str] | None:
        blob = self._blob(name)
        try:
            with translated(_BLOB, "read", None):
                downloader = blob.download_blob()
                data = downloader.readall()
        except ResourceNotFoundError:
            return None
        return data, str(downloader.properties.etag)

    def _in_container(self, call: Callable[[], T], action: str, key: PollerKey) -> T:
        """Run ``call``; if the container does not exist yet, create it and run it again."""
        return creating_parent(
            call,
            self.container.create_container,
            missing="ContainerNotFound",
            service=_BLOB,
            action=action,
            key=key,
        )

    def _with_lease_blob(
        self, blob: BlobClient, key: PollerKey, call: Callable[[], T], *, created: list[str]
    ) -> T:
        """Run ``call``; if the lease blob (or its container) is missing, create it first (the
        container straight away when the service said it is the one missing: one failed
        request fewer on a poller's first run) and append its etag to ``created``.

        SDK errors of ``call`` reach the caller untranslated: it decides what a conflict means.
        """
        try:
            return call()
        except ResourceNotFoundError as exc:
            container_missing = error_code(exc) == "ContainerNotFound"
        if container_missing:
            with (
                suppress(ResourceExistsError),
                translated(_BLOB, "create the container of the lease of", key),
            ):
                self.container.create_container()
        try:
            result = self._in_container(
                lambda: blob.upload_blob(b"", overwrite=False, metadata={"fence": "0"}),
                "create the lease blob of",
                key,
            )
            created.append(str(result["etag"]))
        except ResourceExistsError:
            pass  # another instance created it first
        except HttpResponseError as exc:
            if error_code(exc) != "LeaseIdMissing":  # it exists, already leased
                raise
        return call()


def _lost(grant: LeaseGrant, detail: str) -> LeaseLostError:
    return LeaseLostError(grant.key.poller, grant.key.namespace, grant.fence, detail)


def _quietly(call: Callable[[], object]) -> None:
    with suppress(AzureError):
        call()
