"""Checkpoints as Azure Table entities (etag compare-and-set); leases stay Azure blob leases.

Table layout (default table ``afdbstate``): one entity per poller, ``PartitionKey`` = namespace,
``RowKey`` = poller (both ``%``-encoded). ``Record`` holds the checkpoint JSON and is the only
authoritative property; ``Fence``, ``Position``, ``Attempts`` and ``CommittedAt`` repeat parts of
it for people browsing the table. Leases live as blobs in the same account (container
``afdb-leases`` by default), so their expiry is the Azure lease service's, never a local clock.
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
from azure_functions_db.core.ports import LeaseGrant, LeaseInfo, StoredCheckpoint
from azure_functions_db.errors import CheckpointConflictError, ConfigurationError, RecordExistsError
from azure_functions_db.state import _common
from azure_functions_db.state.blob import BlobStateStore
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

_TABLE = "Table"
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
        self._connection = connection
        self._table_name = table
        self._settings = settings
        self._client = client
        self._client_options = dict(client_options or {})
        self._table: TableClient | None = None
        self._leases = leases or BlobStateStore(
            connection, container=lease_container, settings=settings
        )

    @property
    def table(self) -> TableClient:
        """The table client, created from settings at first use."""
        if self._table is None:
            service = self._client or self._make_client()
            self._table = service.get_table_client(self._table_name)
        return self._table

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

    def _in_table(self, call: Callable[[], T], key: PollerKey) -> T:
        """Run ``call``; if the table does not exist yet, create it and run it again."""
        return creating_parent(
            call,
            self.table.create_table,
            missing="TableNotFound",
            service=_TABLE,
            action="write the checkpoint of",
            key=key,
        )


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
