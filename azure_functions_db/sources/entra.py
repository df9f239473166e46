"""Database sign-in with Microsoft Entra ID access tokens instead of passwords.

Azure Database for PostgreSQL and MySQL (flexible server) take an Entra ID access token as the
password; Azure SQL takes one through the ODBC driver's ``SQL_COPT_SS_ACCESS_TOKEN``. With
``credential=`` on a source or sink, every new database connection signs in with a token from
that credential (an ``azure.core.credentials.TokenCredential``: ``ManagedIdentityCredential``
in Azure, ``AzureCliCredential`` on a developer's machine, or ``"default"`` for
``DefaultAzureCredential``). The token is fetched when a connection is opened and kept until
five minutes before it expires, so pooled connections never need one and a new connection
never gets a stale one. No token is ever logged.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import sqlalchemy as sa

from azure_functions_db.errors import ConfigurationError

#: The token audience of each backend.
SCOPES = {
    "postgresql": "https://ossrdbms-aad.database.windows.net/.default",
    "mysql": "https://ossrdbms-aad.database.windows.net/.default",
    "mssql": "https://database.windows.net/.default",
}
#: Seconds before expiry at which a cached token is replaced.
REFRESH_BEFORE = 300.0
#: The ODBC connection attribute that carries an access token (msodbcsql).
SQL_COPT_SS_ACCESS_TOKEN = 1256


def check_credential(credential: Any) -> Any:
    """``credential`` if it can be one (``"default"`` or an object with ``get_token``); checked
    when the source or sink is made, resolved only when it opens (no import, no I/O before)."""
    if credential != "default" and not callable(getattr(credential, "get_token", None)):
        raise ConfigurationError(
            f"`credential={credential!r}` is not a token credential: pass an "
            '`azure.identity` credential (e.g. `ManagedIdentityCredential()`) or "default".'
        )
    return credential


def resolve_credential(credential: Any) -> Any:
    """``credential`` as a token credential: ``"default"`` is ``DefaultAzureCredential``
    (from ``azure-identity``, the ``azure`` extra); an object must have ``get_token``."""
    if credential == "default":
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as exc:
            raise ConfigurationError(
                '`credential="default"` needs azure-identity: install `afdb[azure]`.'
            ) from exc
        return DefaultAzureCredential()
    return check_credential(credential)


class TokenCache:
    """One credential's token for one scope, fetched on demand and kept until shortly before
    it expires. Thread-safe (connections open on several threads)."""

    def __init__(self, credential: Any, scope: str) -> None:
        self._credential = credential
        self._scope = scope
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0

    def token(self) -> str:
        with self._lock:
            if self._token is None or self._expires_on - time.time() <= REFRESH_BEFORE:
                access = self._credential.get_token(self._scope)
                self._token, self._expires_on = str(access.token), float(access.expires_on)
            return self._token


def sign_in_with_tokens(engine: sa.Engine, credential: Any, masked_url: str) -> TokenCache:
    """Make every new connection of ``engine`` sign in with a token of ``credential``."""
    backend = engine.dialect.name
    scope = SCOPES.get(backend)
    if scope is None:
        raise ConfigurationError(
            f"`credential=` signs in to Azure Database for PostgreSQL or MySQL and to Azure "
            f"SQL; `{masked_url}` is {backend}: remove `credential=`."
        )
    cache = TokenCache(resolve_credential(credential), scope)

    def sign_in(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        token = cache.token()
        if backend == "mssql":  # pyodbc: the token as the driver's access-token attribute
            raw = token.encode("utf-16-le")
            attrs = dict(cparams.get("attrs_before") or {})
            attrs[SQL_COPT_SS_ACCESS_TOKEN] = struct.pack(f"<I{len(raw)}s", len(raw), raw)
            cparams["attrs_before"] = attrs
            return
        cparams["password"] = token

    sa.event.listen(engine, "do_connect", sign_in)
    return cache
