"""Checkpoints and quarantine records as Azure Table entities (etag compare-and-set); leases
stay Azure blob leases.

Table layout (default table ``afdbstate``): one entity per poller, ``PartitionKey`` = namespace,
``RowKey`` = poller (both ``%``-encoded). ``Record`` holds the checkpoint JSON and is the only
authoritative property; ``Fence``, ``Position``, ``Attempts`` and ``CommittedAt`` repeat parts of
it for people browsing the table. Leases live as blobs in the same account (container
``afdb-leases`` by default), so their expiry is the Azure lease service's, never a local clock.

Quarantine records live in a table of their own, chunked over entities: see
:mod:`azure_functions_db.state._table_chunks` for their layout.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableEntity, TableServiceClient, UpdateMode

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, encode_checkpoint
from azure_functions_db.core.ports import (
    LeaseGrant,
    LeaseInfo,
    StoredCheckpoint,
    StoredQuarantine,
)
from azure_functions_db.core.quarantine import QuarantineRecord, encode_record
from azure_functions_db.errors import (
    CheckpointConflictError,
    ConfigurationError,
    QuarantineCorruptError,
    RecordExistsError,
    TransientStoreError,
)
from azure_functions_db.state import _common, _table_chunks
from azure_functions_db.state._table_chunks import quarantine_table_name
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.storage import (
    CLIENT_OPTIONS,
    DEFAULT_CONNECTION,
    encode_name,
    error_code,
    resolve_storage,
    translate_error,
    translated,
)

__all__ = ["TableStateStore", "quarantine_table_name"]  # quarantine_table_name: re-exported

T = TypeVar("T")

_TABLE = _table_chunks.SERVICE
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
# azure-core's RetryPolicy: about 0.8 s, 1.6 s, 3.2 s.
_RETRY = {"retry_total": 3, "retry_backoff_factor": 0.8, "retry_backoff_max": 8}


class TableStateStore:
    """Checkpoints in an Azure Table; leases as Azure blob leases in the same account.

    Args:
        connection: App setting with the storage connection, read at first use (see
            :class:`~azure_functions_db.state.blob.BlobStateStore`; identity-based settings
            use ``__tableServiceUri`` / ``__accountName``).
        table: Table for checkpoints, created on first use (letters and digits, 3-63).
        quarantine_table: Table for quarantine records, created on first use; default
            :func:`quarantine_table_name` of ``table`` (``afdbstateq``). Never ``table`` itself.
        lease_container: Blob container for the leases, created on first use.
        settings: Where to read ``connection`` from; default: the environment, at first use.
        client: A ready ``TableServiceClient`` (overrides ``connection`` for the table).
        leases: A ready lease store (overrides ``connection`` and ``lease_container``).
        client_options: Extra keyword arguments for the ``TableServiceClient`` (timeouts,
            retry settings, ``raw_request_hook``/``raw_response_hook``; the table clients it
            makes do not inherit ``per_call_policies``).
    """

    def __init__(
        self,
        connection: str = DEFAULT_CONNECTION,
        *,
        table: str = "afdbstate",
        quarantine_table: str | None = None,
        lease_container: str = "afdb-leases",
        settings: Mapping[str, str] | None = None,
        client: TableServiceClient | None = None,
        leases: BlobStateStore | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _TABLE_NAME.match(table):
            raise ConfigurationError(
                f"Invalid table name `{table}`: use 3-63 letters and digits, starting with a "
                'letter (e.g. `table="afdbstate"`).'
            )
        quarantine = quarantine_table or quarantine_table_name(table)
        if not _TABLE_NAME.match(quarantine) or quarantine.lower() == table.lower():
            raise ConfigurationError(
                f"Invalid quarantine table name `{quarantine}`: use 3-63 letters and digits, "
                "starting with a letter, other than the checkpoint table (e.g. "
                f'`quarantine_table="{quarantine_table_name("afdbstate")}"`, or leave it out).'
            )
        self._quarantine_name = quarantine
        self._connection = connection
        self._table_name = table
        self._settings = settings
        self._client = client
        self._client_options = dict(client_options or {})
        self._table: TableClient | None = None
        self._quarantine: TableClient | None = None
        self._service: TableServiceClient | None = client
        self._leases = leases or BlobStateStore(
            connection, container=lease_container, settings=settings
        )

    @property
    def table(self) -> TableClient:
        """The table client, created from settings at first use."""
        if self._table is None:
            self._table = self._service_client().get_table_client(self._table_name)
        return self._table

    @property
    def quarantine_table(self) -> TableClient:
        """The client of the quarantine table, created from settings at first use."""
        if self._quarantine is None:
            self._quarantine = self._service_client().get_table_client(self._quarantine_name)
        return self._quarantine

    def _service_client(self) -> TableServiceClient:
        if self._service is None:
            self._service = self._make_client()
        return self._service

    def _make_client(self) -> TableServiceClient:
        env = os.environ if self._settings is None else self._settings
        target = resolve_storage(env, self._connection)
        options = {**_RETRY, **CLIENT_OPTIONS, **self._client_options}
        if target.connection_string is not None:
            return TableServiceClient.from_connection_string(target.connection_string, **options)
        if target.table_url is None:
            raise ConfigurationError(
                f"Set `{target.setting}__accountName` or `{target.setting}__tableServiceUri` "
                "for the Table state store."
            )
        return TableServiceClient(target.table_url, credential=target.credential, **options)

    # -- CheckpointStore ---------------------------------------------------------------------

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.read`."""
        entity = self._get(key)
        if entity is None:
            return None
        return StoredCheckpoint(_common.decode_record(key, _record(entity)), _etag(entity))

    def create(self, checkpoint: Checkpoint) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.create`."""
        key = checkpoint.key
        entity = _entity(checkpoint)
        try:
            result = self._in_table(lambda: self.table.create_entity(entity), key)
        except ResourceExistsError as exc:
            raise RecordExistsError(key.poller, key.namespace) from exc
        return str(result["etag"])

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.replace`."""
        key = checkpoint.key
        try:
            result = self.table.update_entity(
                _entity(checkpoint),
                mode=UpdateMode.REPLACE,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            raise self._conflict(checkpoint, etag) from exc
        except AzureError as exc:
            # The service answers 400 InvalidInput (not 412) to an etag that is not one of its
            # own; such an etag matches no record: a conflict. Any other error is not.
            if error_code(exc) == "InvalidInput":
                conflict = self._conflict(checkpoint, etag)
                if conflict.found_etag != etag:
                    raise conflict from exc
            raise translate_error(exc, _TABLE, "write the checkpoint of", key) from exc
        return str(result["etag"])

    def _conflict(self, checkpoint: Checkpoint, etag: str) -> CheckpointConflictError:
        found = self._get(checkpoint.key)
        found_etag = _etag(found) if found is not None else None
        found_data = _record(found) if found is not None else None
        return _common.conflict(checkpoint, etag, found_etag, found_data)

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.list_keys`."""
        select = ["PartitionKey", "RowKey"]
        try:
            with translated(_TABLE, "list", None):
                if namespace is None:
                    entities = list(self.table.list_entities(select=select))
                else:
                    entities = list(
                        self.table.query_entities(
                            "PartitionKey eq @ns",
                            parameters={"ns": encode_name(namespace)},
                            select=select,
                        )
                    )
        except ResourceNotFoundError:
            return []
        keys = [PollerKey(unquote(e["PartitionKey"]), unquote(e["RowKey"])) for e in entities]
        return sorted(keys, key=lambda k: (k.namespace, k.poller))

    def write_raw(self, key: PollerKey, record: str) -> None:
        """Store ``record`` as the ``Record`` of ``key`` unconditionally (tests, repair tools)."""
        entity = {"PartitionKey": encode_name(key.namespace), "RowKey": encode_name(key.poller)}
        self._in_table(
            lambda: self.table.upsert_entity({**entity, "Record": record}, mode=UpdateMode.REPLACE),
            key,
        )

    # -- QuarantineStore ---------------------------------------------------------------------

    def put_quarantined(self, record: QuarantineRecord) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.put_quarantined`."""
        key = record.key
        action = f"create quarantine record `{record.id}` of"
        header, chunks = _table_chunks.layout(key, record.id, encode_record(record))
        header.update(_table_chunks.summary(record))
        _table_chunks.write_chunks(self.quarantine_table, chunks, key, action)
        try:
            result = self._in_quarantine_table(
                lambda: self.quarantine_table.create_entity(header), key, action
            )
        except ResourceExistsError as exc:
            _table_chunks.drop_chunks(self.quarantine_table, chunks)
            raise _common.quarantine_exists(record) from exc
        return str(result["etag"])

    def read_quarantined(self, key: PollerKey, record_id: str) -> StoredQuarantine | None:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.read_quarantined`.

        A read that meets a replace (which deletes the chunks it was reading) starts over;
        after ``_table_chunks.READ_ATTEMPTS`` such reads it raises ``TransientStoreError``.
        """
        for _ in range(_table_chunks.READ_ATTEMPTS):
            header = self._quarantine_header(key, record_id)
            if header is None:
                return None
            etag = _etag(header)
            try:
                data = _table_chunks.read_payload(self.quarantine_table, key, record_id, header)
            except QuarantineCorruptError:
                again = self._quarantine_header(key, record_id, select=_table_chunks.HEADER)
                if again is None or _etag(again) != etag:
                    continue  # replaced (or removed) while being read: read it anew
                raise
            return StoredQuarantine(_common.decode_quarantined(key, record_id, data), etag)
        raise TransientStoreError(
            f"Quarantine record `{record_id}` of poller `{key.poller}` (namespace "
            f"`{key.namespace}`) was replaced {_table_chunks.READ_ATTEMPTS} times while being "
            "read; retry when its writers are done.",
            poller=key.poller,
            namespace=key.namespace,
        )

    def replace_quarantined(self, record: QuarantineRecord, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.replace_quarantined`."""
        key = record.key
        action = f"write quarantine record `{record.id}` of"
        current = self._quarantine_header(key, record.id, select=_table_chunks.HEADER)
        if current is None or _etag(current) != etag:
            found = _etag(current) if current is not None else None
            raise _common.quarantine_conflict(record, etag, found)
        header, chunks = _table_chunks.layout(key, record.id, encode_record(record))
        header.update(_table_chunks.summary(record))
        _table_chunks.write_chunks(self.quarantine_table, chunks, key, action)
        try:
            with translated(_TABLE, action, key):
                result = self.quarantine_table.update_entity(
                    header,
                    mode=UpdateMode.REPLACE,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            _table_chunks.drop_chunks(self.quarantine_table, chunks)
            found_header = self._quarantine_header(key, record.id, select=_table_chunks.HEADER)
            found = _etag(found_header) if found_header is not None else None
            raise _common.quarantine_conflict(record, etag, found) from exc
        # The header named `current`'s version until this write: nothing names it any more.
        _table_chunks.drop_chunks(
            self.quarantine_table, _table_chunks.old_chunks(key, record.id, current)
        )
        return str(result["etag"])

    def list_quarantined(self, key: PollerKey) -> Sequence[str]:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.list_quarantined`."""
        try:
            with translated(_TABLE, "list the quarantine records of", key):
                rows = [
                    str(e["RowKey"])
                    for e in self.quarantine_table.query_entities(
                        "PartitionKey eq @pk",
                        parameters={"pk": _table_chunks.partition(key)},
                        select=["RowKey"],
                    )
                ]
        except ResourceNotFoundError:
            return []
        return sorted(unquote(row) for row in rows if _table_chunks.SEP not in row)

    def write_quarantined_raw(self, key: PollerKey, record_id: str, data: bytes) -> str:
        """Store ``data`` as quarantine record ``record_id`` of ``key`` unconditionally, in the
        layout of a real record (chunks, then header), and return its etag.

        For tests and repair tools only: it plays an out-of-band writer (a bad restore, a bug
        elsewhere) so a test can check how a corrupt or misplaced record is handled. Binary
        properties hold any bytes, NUL included. The chunks of the version it replaces are left
        behind.
        """
        action = f"write quarantine record `{record_id}` of"
        header, chunks = _table_chunks.layout(key, record_id, bytes(data))
        _table_chunks.write_chunks(self.quarantine_table, chunks, key, action)
        result = self._in_quarantine_table(
            lambda: self.quarantine_table.upsert_entity(header, mode=UpdateMode.REPLACE),
            key,
            action,
        )
        return str(result["etag"])

    # -- LeaseManager: Azure blob leases in the same account ---------------------------------

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.acquire`."""
        return self._leases.acquire(key, owner, duration)

    def renew(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.renew`."""
        self._leases.renew(grant)

    def release(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.release`."""
        self._leases.release(grant)

    def inspect(self, key: PollerKey) -> LeaseInfo:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.inspect`."""
        return self._leases.inspect(key)

    # -- StateStore --------------------------------------------------------------------------

    def describe(self) -> str:
        """``table:<account>/<table>`` (no secrets)."""
        leases = self._leases.describe()  # blob:<account>/<container>
        account = leases.removeprefix("blob:").split("/", 1)[0]
        return f"table:{account}/{self._table_name}"

    def __repr__(self) -> str:
        return f"TableStateStore(connection={self._connection!r}, table={self._table_name!r})"

    # -- internals ---------------------------------------------------------------------------

    def _get(self, key: PollerKey) -> TableEntity | None:
        try:
            with translated(_TABLE, "read the checkpoint of", key):
                return self.table.get_entity(encode_name(key.namespace), encode_name(key.poller))
        except ResourceNotFoundError:
            return None

    def _quarantine_header(
        self, key: PollerKey, record_id: str, *, select: list[str] | None = None
    ) -> TableEntity | None:
        """The header entity of ``record_id`` (only the ``select`` properties), or ``None``."""
        return _table_chunks.read_header(self.quarantine_table, key, record_id, select=select)

    def _in_quarantine_table(self, call: Callable[[], T], key: PollerKey, action: str) -> T:
        """Run ``call``; if the quarantine table does not exist yet, create it and run it again."""
        return _table_chunks.in_table(self.quarantine_table, call, key, action)

    def _in_table(self, call: Callable[[], T], key: PollerKey) -> T:
        """Run ``call``; if the table does not exist yet, create it and run it again."""
        return _table_chunks.in_table(self.table, call, key, "write the checkpoint of")


def _entity(checkpoint: Checkpoint) -> dict[str, Any]:
    key = checkpoint.key
    return {
        "PartitionKey": encode_name(key.namespace),
        "RowKey": encode_name(key.poller),
        "Record": encode_checkpoint(checkpoint).decode("utf-8"),
        "Fence": checkpoint.fence,
        "Position": str(checkpoint.position) if checkpoint.position else "",
        "Attempts": checkpoint.attempts,
        "CommittedAt": checkpoint.committed_at.isoformat() if checkpoint.committed_at else "",
    }


def _record(entity: TableEntity) -> bytes:
    record = entity.get("Record")
    return record.encode("utf-8") if isinstance(record, str) else b""


def _etag(entity: TableEntity) -> str:
    return str(entity.metadata["etag"])
