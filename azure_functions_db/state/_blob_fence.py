"""The fence of a Blob lease: a counter in the lease blob's metadata, raised by every acquire
under the new lease, on the etag it was read (or created) with."""

from __future__ import annotations

from collections.abc import Mapping

from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError
from azure.storage.blob import BlobClient, BlobLeaseClient

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.errors import ConfigurationError, StateStoreError


def raise_fence(
    blob: BlobClient, lease: BlobLeaseClient, key: PollerKey, owner: str, created: str | None
) -> int:
    """Raise the fence of the lease blob whose lease ``lease`` holds; the new fence.

    ``created``: the etag of the blob as this acquire created it, with fence 0. Acquiring a lease
    does not change a blob's etag, so a write conditional on it succeeds only if nobody wrote
    the blob since (no other owner raised the fence in between): fence 1 without reading the
    blob first. Otherwise (or when the blob existed) the fence is read, and written back raised
    on the etag it was read with.
    """
    metadata = {"owner": ascii_text(owner)}
    if created is not None:
        try:
            blob.set_blob_metadata(
                {"fence": "1", **metadata},
                lease=lease,
                etag=created,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError:
            pass  # written since it was created: read the fence it holds now
        else:
            return 1
    props = blob.get_blob_properties(lease=lease)
    fence = fence_of(props.metadata, key) + 1
    blob.set_blob_metadata(
        {"fence": str(fence), **metadata},
        lease=lease,
        etag=props.etag,
        match_condition=MatchConditions.IfNotModified,
    )
    return fence


def ascii_text(text: str) -> str:
    """``text`` as a metadata value: ASCII only (the owner is informational only)."""
    return text.encode("ascii", "replace").decode("ascii")[:256]


def lease_seconds(duration: float) -> int:
    """``duration`` as the whole seconds of an Azure blob lease (15 to 60)."""
    seconds = int(duration)
    if seconds != duration or not 15 <= seconds <= 60:
        raise ConfigurationError(
            f"`lease_duration={duration!r}` cannot be an Azure blob lease: use a whole number "
            "of seconds from 15 to 60 (e.g. `lease_duration=30`)."
        )
    return seconds


def fence_of(metadata: Mapping[str, str], key: PollerKey) -> int:
    """The fence a lease blob's metadata holds (0 when none)."""
    text = metadata.get("fence", "0")
    if not text.isdigit():
        raise StateStoreError(
            f"The lease blob of poller `{key.poller}` (namespace `{key.namespace}`) has a "
            f"corrupt fence `{text}` in its metadata. Stop every instance of the poller and set "
            "`fence` to the fence shown by `afdb status` for its checkpoint (or higher)."
        )
    return int(text)
