"""The framework's own app settings (``AFDB_*``), read once into one validated model.

Settings arrive as strings (the environment, ``local.settings.json``'s ``Values``, the app
settings of a Function App). :class:`AppSettings` is the one place that reads them, coerces them
and says what is wrong with a bad one: the error names the setting, the value and the fix, and
never echoes a value that could be a secret.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from azure_functions_db.core.logs import log_event
from azure_functions_db.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Directory of the default local state store (outside a Functions host).
STATE_DIR_SETTING = "AFDB_STATE_DIR"
DEFAULT_STATE_DIR = ".afdb/state"
#: App setting that turns the automatic OpenTelemetry metrics off.
METRICS_SETTING = "AFDB_OTEL_METRICS"
#: App setting that turns the automatic OpenTelemetry traces off.
TRACES_SETTING = "AFDB_OTEL_TRACES"
#: Which default state store a poller without ``state=`` uses: ``local`` or ``azure`` (unset:
#: Azure under a Functions host, local elsewhere). ``afdb --state`` sets it for one command.
STATE_SETTING = "AFDB_STATE"

_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})

#: How to fix each setting, for the error that names it.
_FIXES = {
    STATE_DIR_SETTING: "set it to a directory path, e.g. `.afdb/state`, or remove it",
    METRICS_SETTING: "use `true` or `false`",
    TRACES_SETTING: "use `true` or `false`",
    STATE_SETTING: "use `local` (a LocalStateStore in AFDB_STATE_DIR) or `azure` (Blob Storage "
    "on AzureWebJobsStorage), or remove it (Azure under a Functions host, local elsewhere)",
}


class AppSettings(BaseModel):
    """The ``AFDB_*`` settings of one process, validated.

    Attributes:
        state_dir: Directory of the default local state store (``AFDB_STATE_DIR``; blank or
            unset means ``.afdb/state``).
        state: The default state store of a poller without ``state=`` (``AFDB_STATE``):
            ``local``, ``azure``, or ``None`` (Azure under a Functions host, local elsewhere).
        otel_traces: Whether runs write OpenTelemetry traces (``AFDB_OTEL_TRACES``; as
            ``otel_metrics``).
        otel_metrics: Whether runs record OpenTelemetry metrics (``AFDB_OTEL_METRICS``; on
            unless ``false``, ``0``, ``no`` or ``off``). An unreadable value keeps them on and
            is logged: a typo in a metrics switch must not stop delivery.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    state_dir: Path = Field(default=Path(DEFAULT_STATE_DIR), alias="AFDB_STATE_DIR")
    otel_metrics: bool = Field(default=True, alias="AFDB_OTEL_METRICS")
    otel_traces: bool = Field(default=True, alias="AFDB_OTEL_TRACES")
    state: Literal["local", "azure"] | None = Field(default=None, alias="AFDB_STATE")

    @field_validator("state", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.strip().lower() or None
        return value

    @field_validator("state_dir", mode="before")
    @classmethod
    def _blank_is_default(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return Path(DEFAULT_STATE_DIR)
        return value

    @field_validator("otel_metrics", "otel_traces", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip().lower()
        if text in _OFF:
            return False
        if text not in _ON:
            log_event(
                logger,
                logging.WARNING,
                "metrics_setting_invalid",
                setting=f"{METRICS_SETTING} or {TRACES_SETTING}",
                note="use true or false; they stay on",
            )
        return True

    @classmethod
    def read(cls, settings: Mapping[str, str]) -> AppSettings:
        """The settings in ``settings`` (other keys are ignored); errors name setting and fix."""
        values = {name: settings[name] for name in _FIXES if name in settings}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            name = str(loc[0]) if loc else ""
            field = cls.model_fields.get(name)
            name = (field.alias if field is not None else None) or name
            raise ConfigurationError(
                f"App setting `{name}` is not usable: {_FIXES.get(name, 'check its value')}."
            ) from None
