"""Azure Storage connection settings, read the way the Functions host reads them (shared by the
Blob and Table stores and the queue sink).

``<NAME>`` (default ``AzureWebJobsStorage``) is either a connection string (including
``UseDevelopmentStorage=true`` for Azurite), or absent, in which case the identity-based form is
used: ``<NAME>__blobServiceUri`` / ``__queueServiceUri`` / ``__tableServiceUri`` or
``<NAME>__accountName``, with
``DefaultAzureCredential`` (``<NAME>__clientId`` selects a user-assigned managed identity;
``<NAME>__credential=managedidentity`` forces a managed identity).

Nothing here logs or raises a secret: errors name settings, never their values.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.settings import check_resolved
from azure_functions_db.errors import ConfigurationError, StateStoreError, TransientStoreError

T = TypeVar("T")

DEFAULT_CONNECTION = "AzureWebJobsStorage"

# Fail fast and retry a little inside the SDK; the engine retries whole operations on top.
CLIENT_OPTIONS: dict[str, Any] = {"connection_timeout": 5, "read_timeout": 15}


@dataclass(frozen=True)
class StorageTarget:
    """Where the account is and how to authenticate, resolved from settings.

    Exactly one of ``connection_string`` and ``credential`` is set.
    """

    setting: str
    account: str
    blob_url: str | None
    table_url: str | None
    connection_string: str | None = None
    credential: Any = None
    queue_url: str | None = None

    def __repr__(self) -> str:  # never show the connection string
        return f"StorageTarget(setting={self.setting!r}, account={self.account!r})"


# The SDK logs every request and response at INFO on this logger. Under Functions the worker
# forwards INFO to Application Insights, which would record several lines per storage call.
SDK_REQUEST_LOGGER = "azure.core.pipeline.policies.http_logging_policy"


def quiet_sdk_request_logs() -> None:
    """Raise the SDK's per-request logger to WARNING unless the app has set its level."""
    logger = logging.getLogger(SDK_REQUEST_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def resolve_storage(settings: Mapping[str, str], setting: str) -> StorageTarget:
    """Read ``setting`` (and its ``__`` variants) from ``settings``."""
    quiet_sdk_request_logs()
    value = (settings.get(setting) or "").strip()
    if value:
        check_resolved(setting, value, "the state store")
        if "=" not in value:
            raise ConfigurationError(
                f"App setting `{setting}` does not look like a storage connection string. Use "
                "`UseDevelopmentStorage=true` for Azurite, a full connection string, or remove "
                f"it and set `{setting}__accountName` for managed identity."
            )
        return StorageTarget(
            setting=setting,
            account=_account_from_connection_string(value),
            blob_url=None,
            table_url=None,
            connection_string=value,
        )
    account = (settings.get(f"{setting}__accountName") or "").strip()
    blob_url = (settings.get(f"{setting}__blobServiceUri") or "").strip() or None
    table_url = (settings.get(f"{setting}__tableServiceUri") or "").strip() or None
    queue_url = (settings.get(f"{setting}__queueServiceUri") or "").strip() or None
    if not (account or blob_url or table_url or queue_url):
        raise ConfigurationError(
            f"App setting `{setting}` is not defined. Set it to a storage connection string "
            "(`UseDevelopmentStorage=true` for Azurite), or for managed identity set "
            f"`{setting}__accountName` (or `{setting}__blobServiceUri` and "
            f"`{setting}__tableServiceUri`)."
        )
    for kind, url in (("blob", blob_url), ("table", table_url), ("queue", queue_url)):
        if url is not None and not url.lower().startswith("https://"):
            name = f"{setting}__{kind}ServiceUri"
            raise ConfigurationError(
                f"App setting `{name}` is `{url}`, but an identity (token) sign-in is only sent "
                "over HTTPS. Use its `https://` address (in Azure: "
                f"`https://<account>.{kind}.core.windows.net`); for Azurite, which serves HTTP, "
                f"set `{setting}=UseDevelopmentStorage=true` instead (or run "
                "`afdb ... --state local`)."
            )
    if account:
        blob_url = blob_url or f"https://{account}.blob.core.windows.net"
        table_url = table_url or f"https://{account}.table.core.windows.net"
        queue_url = queue_url or f"https://{account}.queue.core.windows.net"
    return StorageTarget(
        setting=setting,
        account=account or _account_from_url(blob_url or table_url or queue_url or ""),
        blob_url=blob_url,
        table_url=table_url,
        credential=_credential(settings, setting),
        queue_url=queue_url,
    )


def _credential(settings: Mapping[str, str], setting: str) -> Any:
    try:
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
    except ImportError as exc:  # pragma: no cover - the `azure` extra brings it
        raise ConfigurationError(
            f"Identity-based `{setting}__...` settings need azure-identity: "
            "`pip install afdb[azure]`."
        ) from exc
    client_id = (settings.get(f"{setting}__clientId") or "").strip() or None
    if (settings.get(f"{setting}__credential") or "").strip().lower() == "managedidentity":
        return ManagedIdentityCredential(client_id=client_id)
    return DefaultAzureCredential(managed_identity_client_id=client_id)


def _account_from_connection_string(value: str) -> str:
    parts = dict(
        part.split("=", 1) for part in value.split(";") if "=" in part
    )  # values may contain '=' (keys): split once
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        return "devstoreaccount1"
    return parts.get("AccountName") or _account_from_url(parts.get("BlobEndpoint", ""))


def _account_from_url(url: str) -> str:
    match = re.match(r"https?://([^./:]+)\.", url)
    if match:
        return match.group(1)
    # Azurite style: http://127.0.0.1:10000/devstoreaccount1
    path = re.match(r"https?://[^/]+/([^/?]+)", url)
    return path.group(1) if path else "unknown"


def encode_name(name: str) -> str:
    """A namespace or poller name as one path segment / table key (``%``-encoded)."""
    return quote(name, safe="")


def error_code(exc: Exception) -> str | None:
    """The storage service's error code (``x-ms-error-code``) the SDKs attach to errors."""
    code = getattr(exc, "error_code", None)
    if code is not None:
        return str(getattr(code, "value", code))  # the SDKs' codes are str enums
    # azure-data-tables leaves it unset on some errors; the service's code is in the body.
    match = _BODY_CODE.search(str(exc))
    return (match.group(1) or match.group(2)) if match else None


_BODY_CODE = re.compile(r'"code"\s*:\s*"(\w+)"|ErrorCode:(\w+)')

_ROLES = {
    "Blob": "Storage Blob Data Contributor",
    "Table": "Storage Table Data Contributor",
    "Queue": "Storage Queue Data Message Sender",
}


@contextmanager
def translated(service: str, action: str, key: PollerKey | None) -> Iterator[None]:
    """Turn SDK errors into the project's, except the ones callers handle themselves
    (not found, already exists, modified)."""
    try:
        yield
    except (ResourceNotFoundError, ResourceExistsError, ResourceModifiedError):
        raise
    except AzureError as exc:
        raise translate_error(exc, service, action, key) from exc


def translate_error(
    exc: AzureError, service: str, action: str, key: PollerKey | None
) -> StateStoreError:
    """The project's error for an SDK error: transient (5xx, 408, 429, network) or not."""
    what = f"{action} poller `{key.poller}` (namespace `{key.namespace}`)" if key else action
    if isinstance(exc, ClientAuthenticationError) or getattr(exc, "status_code", None) == 403:
        return StateStoreError(
            f"{service} state store could not {what}: not authorised. With managed identity, "
            f"grant the app the `{_ROLES.get(service, 'Storage Data Contributor')}` role on the "
            "storage account; with a connection string, check its key."
        )
    status = getattr(exc, "status_code", None)
    transient = isinstance(exc, ServiceRequestError | ServiceResponseError) or (
        isinstance(status, int) and (status >= 500 or status in (408, 429))
    )
    cls = TransientStoreError if transient else StateStoreError
    detail = f"HTTP {status} {error_code(exc)}" if status else type(exc).__name__
    return cls(f"{service} state store could not {what}: {detail}.")


def creating_parent(
    call: Callable[[], T],
    create: Callable[[], object],
    *,
    missing: str,
    service: str,
    action: str,
    key: PollerKey,
) -> T:
    """Run ``call``; if it fails because its container or table (error code ``missing``) does
    not exist yet, ``create`` that (a racing creator is fine) and run ``call`` again."""
    try:
        with translated(service, action, key):
            return call()
    except ResourceNotFoundError as exc:
        if error_code(exc) != missing:
            raise
    with suppress(ResourceExistsError), translated(service, f"create the parent of {action}", None):
        create()
    with translated(service, action, key):
        return call()
