"""Quarantine records of :class:`~azure_functions_db.state.table.TableStateStore`, chunked
over Azure Table entities.

Quarantine records live in a table of their own (default: the checkpoint table's name + ``q``,
``afdbstateq``; see :func:`quarantine_table_name`), so ``list_keys``, which lists every entity of
the checkpoint table, never sees them. A record (``encode_record`` bytes, often MBs) is larger
than one entity may be (1 MiB; 64 KiB per property), so it is cut into segments of
``_SEGMENT`` bytes, each held by one entity in binary properties ``Data00``..``Data09`` of at
most ``_PART`` bytes. All entities of one poller share one partition, ``<namespace>!<poller>``
(``!`` is never in an encoded name)::

    RowKey <id>                         the header: Layout=1, Version=<hex>, Chunks=<n>,
                                        Size=<bytes>, Sha256=<hex> and the first segment;
                                        State, Rows, Fence, Attempts, At, Error repeat parts of
                                        the record for people browsing the table
    RowKey <id>!<version>!<000000..>    the chunks: the following segments of that version

The header is what makes a record visible, and it is written last: a put writes the chunks of a
fresh version, then creates the header (create-only); a replace reads the header, writes the
chunks of a fresh version, then replaces the header by etag. A crash in between leaves either
no record or the old version whole, plus chunks that no header names (invisible garbage, never
read). Chunks are never changed once written, only deleted: the old version's after a replace
wins, the new version's after a put or replace loses (best effort; only when the loss is
certain, never after an error that may have landed). A reader checks the version's chunks
against ``Size`` and ``Sha256``; when one is missing or the hash differs it reads the header
again, and if the header moved on (a replace deleted the chunks it was reading) it starts over;
otherwise the record is corrupt (:class:`~azure_functions_db.errors.QuarantineCorruptError`).

The functions here take the quarantine table's ``TableClient``; the store decides when to call
them (the order above).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient, TableEntity, UpdateMode

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.quarantine import QuarantineRecord
from azure_functions_db.errors import QuarantineCorruptError
from azure_functions_db.state.storage import creating_parent, encode_name, translated

T = TypeVar("T")

SERVICE = "Table"  # the service named in error messages
_LAYOUT = 1
_PART = 64_000  # bytes per binary property: the service allows 64 KiB
_PARTS = 10  # properties per entity: 640,000 bytes (~850 KB as base64), well under 1 MiB
_SEGMENT = _PART * _PARTS
SEP = "!"  # separates key parts; `encode_name` always encodes it
_INDEX = 6  # digits of a chunk's index, so RowKeys sort by index
READ_ATTEMPTS = 5  # reads that may meet a concurrent replace before giving up (transient)
HEADER = ["Layout", "Version", "Chunks"]


def quarantine_table_name(table: str) -> str:
    """The default quarantine table of checkpoint table ``table``: ``<table>q``, or for a name
    of 63 characters, its first 54 + ``q`` + 8 hex digits of its hash (still unique)."""
    name = f"{table}q"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.lower().encode("utf-8")).hexdigest()[:8]
    return f"{table[:54]}q{digest}"


# -- reading and writing ---------------------------------------------------------------------


def in_table(table: TableClient, call: Callable[[], T], key: PollerKey, action: str) -> T:
    """Run ``call``; if ``table`` does not exist yet, create it and run it again."""
    return creating_parent(
        call,
        table.create_table,
        missing="TableNotFound",
        service=SERVICE,
        action=action,
        key=key,
    )


def read_header(
    table: TableClient, key: PollerKey, record_id: str, *, select: list[str] | None = None
) -> TableEntity | None:
    """The header entity of ``record_id`` (only the ``select`` properties), or ``None``."""
    try:
        with translated(SERVICE, f"read quarantine record `{record_id}` of", key):
            return table.get_entity(partition(key), encode_name(record_id), select=select)
    except ResourceNotFoundError:
        return None


def read_payload(table: TableClient, key: PollerKey, record_id: str, header: TableEntity) -> bytes:
    """The bytes a header names, checked against its size and hash."""

    def corrupt(detail: str) -> QuarantineCorruptError:
        return QuarantineCorruptError(key.poller, key.namespace, record_id, detail)

    header_layout = header.get("Layout")
    if header_layout != _LAYOUT:
        raise corrupt(
            f"its header has layout `{header_layout!r}` (this version reads layout {_LAYOUT}); was "
            "it written by a newer azure-functions-db"
        )
    version, chunks = header.get("Version"), header.get("Chunks")
    size, digest = header.get("Size"), header.get("Sha256")
    if not (
        isinstance(version, str)
        and version
        and isinstance(chunks, int)
        and chunks >= 0
        and isinstance(size, int)
        and isinstance(digest, str)
    ):
        raise corrupt("its header lacks a valid Version, Chunks, Size or Sha256")
    segments = [_segment(header)]
    if chunks:
        prefix = _chunk_prefix(record_id, version)
        with translated(SERVICE, f"read quarantine record `{record_id}` of", key):
            found = {
                str(e["RowKey"])[len(prefix) :]: e
                for e in table.query_entities(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                    parameters={
                        "pk": partition(key),
                        "lo": prefix,
                        "hi": prefix[:-1] + chr(ord(SEP) + 1),
                    },
                )
            }
        for index in range(chunks):
            entity = found.get(f"{index:0{_INDEX}d}")
            if entity is None:
                raise corrupt(f"chunk {index + 1} of {chunks} of version `{version}` is missing")
            segments.append(_segment(entity))
    if None in segments:
        raise corrupt(f"a part of version `{version}` is not binary")
    data = b"".join(s for s in segments if s is not None)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise corrupt(
            f"its {len(data)} bytes do not match the size ({size}) and sha256 in its header "
            "(a chunk was altered or lost)"
        )
    return data


def write_chunks(
    table: TableClient, chunks: Sequence[dict[str, Any]], key: PollerKey, action: str
) -> None:
    """Write the chunks of a new version (upserts: a retried write lands the same bytes)."""

    def write() -> None:
        for chunk in chunks:
            table.upsert_entity(chunk, mode=UpdateMode.REPLACE)

    if chunks:
        in_table(table, write, key, action)


def drop_chunks(table: TableClient, chunks: Iterable[Mapping[str, Any]]) -> None:
    """Delete chunks no header names (best effort: one left behind is only garbage)."""
    for chunk in chunks:
        with suppress(AzureError):
            table.delete_entity(chunk["PartitionKey"], chunk["RowKey"])


# -- the layout ------------------------------------------------------------------------------


def partition(key: PollerKey) -> str:
    """The PartitionKey of ``key``'s quarantine records."""
    return f"{encode_name(key.namespace)}{SEP}{encode_name(key.poller)}"


def layout(
    key: PollerKey, record_id: str, data: bytes
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the chunks that store ``data`` as a fresh version of ``record_id``."""
    version = uuid.uuid4().hex
    pk, prefix = partition(key), _chunk_prefix(record_id, version)
    segments = [data[i : i + _SEGMENT] for i in range(0, len(data), _SEGMENT)] or [b""]
    header = {
        "PartitionKey": pk,
        "RowKey": encode_name(record_id),
        "Layout": _LAYOUT,
        "Version": version,
        "Chunks": len(segments) - 1,
        "Size": len(data),
        "Sha256": hashlib.sha256(data).hexdigest(),
        **_parts(segments[0]),
    }
    chunks = [
        {
            "PartitionKey": pk,
            "RowKey": f"{prefix}{index:0{_INDEX}d}",
            **_parts(segment),
        }
        for index, segment in enumerate(segments[1:])
    ]
    return header, chunks


def _parts(segment: bytes) -> dict[str, bytes]:
    """``segment`` as binary properties ``Data00``.. of at most ``_PART`` bytes each."""
    return {
        f"Data{n:02d}": segment[i : i + _PART] for n, i in enumerate(range(0, len(segment), _PART))
    }


def _segment(entity: Mapping[str, Any]) -> bytes | None:
    """The bytes of an entity's ``Data00``.. properties, or ``None`` when one is not binary."""
    parts = []
    for n in range(_PARTS):
        part = entity.get(f"Data{n:02d}")
        if part is None:
            break
        if not isinstance(part, bytes):
            return None
        parts.append(part)
    return b"".join(parts)


def _chunk_prefix(record_id: str, version: str) -> str:
    """The RowKey of every chunk of ``version`` of ``record_id`` begins with this."""
    return f"{encode_name(record_id)}{SEP}{version}{SEP}"


def old_chunks(key: PollerKey, record_id: str, header: TableEntity) -> list[dict[str, Any]]:
    """The keys of the chunks ``header`` names (none when it names no valid version)."""
    version, chunks = header.get("Version"), header.get("Chunks")
    if not (isinstance(version, str) and version and isinstance(chunks, int) and chunks > 0):
        return []
    prefix = _chunk_prefix(record_id, version)
    return [
        {"PartitionKey": partition(key), "RowKey": f"{prefix}{index:0{_INDEX}d}"}
        for index in range(chunks)
    ]


def summary(record: QuarantineRecord) -> dict[str, Any]:
    """Parts of ``record`` repeated on its header for people browsing the table."""
    return {
        "State": record.state,
        "Rows": len(record),
        "Fence": record.fence,
        "Attempts": record.attempts,
        "At": record.at.isoformat(),
        "Error": _shown(record.error[:2000]),
    }


_UNSHOWN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _shown(text: str) -> str:
    """``text`` without the characters a table string may refuse (NUL, controls, lone
    surrogates): a property for people must never make the write of a record fail."""
    return _UNSHOWN.sub("?", text)
