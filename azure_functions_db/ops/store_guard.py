"""The default state store, checked before a command uses it (``afdb run``, ``status``, ...).

A poller without ``state=`` keeps its state where the settings say: Blob Storage under a
Functions host (``local.settings.json`` sets ``FUNCTIONS_WORKER_RUNTIME``, as ``func start``
needs), the local folder otherwise. So adding a ``local.settings.json`` beside an app that ran
without one switches its pollers to Blob, which has no checkpoint for them: the next run would
deliver every row again. Before a command uses the default it checks that:

- the chosen Blob store is reachable (one quick request, no retries); if not, it says which
  endpoint and the ways out (start Azurite, ``--state local``) instead of retrying for half a
  minute;
- the chosen Blob store has a checkpoint for each poller, or the local folder has none: a
  checkpoint only in the other default store means the choice moved. The command then refuses,
  naming both stores and ``--state``.

A choice made on purpose (``state=``, ``--state``, the ``AFDB_STATE`` setting) is not second
guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.errors import ConfigurationError, StateStoreError
from azure_functions_db.runtime.settings import AppSettings

__all__ = ["check_default_stores"]

#: Seconds the reachability request may take to connect and to answer.
PROBE_TIMEOUT = 3


def check_default_stores(pollers: Sequence[Any], settings: Mapping[str, str]) -> None:
    """Raise ``ConfigurationError`` when a poller's default store is unreachable, or moved
    away from the store that holds its checkpoint (see the module's text)."""
    from azure_functions_db.state.blob import BlobStateStore
    from azure_functions_db.state.local import LocalStateStore

    app_settings = AppSettings.read(settings)
    if app_settings.state is not None:
        return  # chosen on purpose
    defaults = [p for p in pollers if p.state is None]
    if not defaults:
        return
    chosen = defaults[0].store(settings)
    if not isinstance(chosen, BlobStateStore):
        return
    probe = _probe(settings)
    local = LocalStateStore(app_settings.state_dir)
    for definition in defaults:
        key: PollerKey = definition.config.key
        try:
            found = probe.read(key)
        except StateStoreError as exc:
            raise _unreachable(probe, exc) from None
        if found is None and local.read(key) is not None:
            raise ConfigurationError(
                f"Poller `{definition.name}` has a checkpoint in the local state store "
                f"`{local.describe()}` but none in `{chosen.describe()}`, which the settings "
                "choose now (they set FUNCTIONS_WORKER_RUNTIME, as under a Functions host: "
                "a local.settings.json does): run on would deliver every row again. Keep "
                "using the local store with `--state local` (or the setting "
                "`AFDB_STATE=local`), or move to Blob on purpose with `--state azure` (then "
                "`afdb seek` sets where it starts)."
            )


def _probe(settings: Mapping[str, str]) -> Any:
    from azure.storage.blob import ExponentialRetry

    from azure_functions_db.state.blob import BlobStateStore

    return BlobStateStore(
        settings=settings,
        client_options={
            "connection_timeout": PROBE_TIMEOUT,
            "read_timeout": PROBE_TIMEOUT,
            "retry_policy": ExponentialRetry(retry_total=0),
        },
    )


def _unreachable(probe: Any, exc: StateStoreError) -> ConfigurationError:
    try:
        endpoint = probe.container.url
    except ConfigurationError as bad:
        return bad
    cause = type(exc.__cause__ or exc).__name__
    return ConfigurationError(
        f"The Blob state store at `{endpoint}` did not answer ({cause}). The settings choose "
        "Blob Storage because they set FUNCTIONS_WORKER_RUNTIME (as under a Functions host). "
        "Start Azurite (`npx azurite --skipApiVersionCheck`) for `UseDevelopmentStorage=true`, "
        "fix `AzureWebJobsStorage`, or keep state in a local folder with `--state local`."
    )
