"""Azure Storage connection settings, read the way the Functions host reads them.

``<NAME>`` (default ``AzureWebJobsStorage``) is either a connection string (including
``UseDevelopmentStorage=true`` for Azurite), or absent, in which case the identity-based form is
used: ``<NAME>__blobServiceUri`` / ``<NAME>__tableServiceUri`` or ``<NAME>__accountName``, with
``DefaultAzureCredential`` (``<NAME>__clientId`` selects a user-assigned managed identity;
``<NAME>__credential=managedidentity`` forces a managed identity).

Nothing here logs or raises a secret: errors name settings, never their values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from azure_functions_db.errors import ConfigurationError

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

    def __repr__(self) -> str:  # never show the connection string
        return f"StorageTarget(setting={self.setting!r}, account={self.account!r})"


def resolve_storage(settings: Mapping[str, str], setting: str) -> StorageTarget:
    """Read ``setting`` (and its ``__`` variants) from ``settings``."""
    value = (settings.get(setting) or "").strip()
    if value:
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
    if not (account or blob_url or table_url):
        raise ConfigurationError(
            f"App setting `{setting}` is not defined. Set it to a storage connection string "
            "(`UseDevelopmentStorage=true` for Azurite), or for managed identity set "
            f"`{setting}__accountName` (or `{setting}__blobServiceUri` and "
            f"`{setting}__tableServiceUri`)."
        )
    if account:
        blob_url = blob_url or f"https://{account}.blob.core.windows.net"
        table_url = table_url or f"https://{account}.table.core.windows.net"
    return StorageTarget(
        setting=setting,
        account=account or _account_from_url(blob_url or table_url or ""),
        blob_url=blob_url,
        table_url=table_url,
        credential=_credential(settings, setting),
    )


def _credential(settings: Mapping[str, str], setting: str) -> Any:
    try:
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
    except ImportError as exc:  # pragma: no cover - the `azure` extra brings it
        raise ConfigurationError(
            f"Identity-based `{setting}__...` settings need azure-identity: "
            "`pip install azure-functions-db[azure]`."
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
