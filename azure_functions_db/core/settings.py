"""Reading one app setting: defined, and not an unresolved platform reference.

Pure: the settings are a mapping handed in (the environment, ``local.settings.json`` values);
nothing here reads the environment itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from azure_functions_db.errors import SettingNotFoundError, UnresolvedSettingError

# What the Functions platform leaves in a setting when it could not resolve a Key Vault
# reference: the reference text itself, `@Microsoft.KeyVault(SecretUri=...)` or `(VaultName=...)`.
_KEY_VAULT_REFERENCE = re.compile(r"\s*@Microsoft\.KeyVault\s*\(", re.IGNORECASE)


def check_resolved(name: str, value: str, where: str) -> str:
    """``value`` of setting ``name``, unless it is a Key Vault reference nobody resolved."""
    if _KEY_VAULT_REFERENCE.match(value):
        raise UnresolvedSettingError(name, where)
    return value


def setting_value(settings: Mapping[str, str], name: str, where: str) -> str:
    """The value of setting ``name`` used by ``where``; errors name the setting and the fix."""
    if name not in settings:
        raise SettingNotFoundError(name, where, getattr(settings, "sources", ()))
    return check_resolved(name, settings[name], where)


def setting_name(value: str) -> str | None:
    """``NAME`` if ``value`` is exactly ``%NAME%``, else ``None``."""
    if len(value) > 2 and value.startswith("%") and value.endswith("%") and "%" not in value[1:-1]:
        return value[1:-1]
    return None
