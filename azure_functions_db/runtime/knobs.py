"""Tuning knobs read from app settings: ``batch_size="%ORDERS_BATCH%"``.

Like the SQL trigger's ``Sql_Trigger_MaxBatchSize``, a poller's ``batch_size``, ``time_budget``,
``max_attempts`` and ``poll_interval`` may name an app setting instead of holding a number, so an
operator changes them without a redeploy (changing an app setting restarts the app). The
decorator only checks that such a value is one ``%NAME%`` reference; the setting is read when the
poller's engine is made (its first run in a process), by :func:`resolve_knobs`, which validates
every knob at once with one pydantic model and raises one error naming each bad setting, its
value and the allowed range.

Azure's MySQL trigger reads its own app settings; a poller on MySQL/MariaDB that leaves
``batch_size`` or ``poll_interval`` at its default reads them the same way
(:data:`MYSQL_TRIGGER_ALIASES`, :func:`alias_knobs`), so an app switching from the trigger keeps
its settings; the log line ``setting_alias`` names the setting read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, ValidationError

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.settings import setting_name, setting_value
from azure_functions_db.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Azure's MySQL trigger's app settings that mean one of our knobs, first name first (the
#: trigger reads ``MySql_Trigger_MaxBatchSize``, then the older ``MySql_Trigger_BatchSize``),
#: and the factor to our unit (its polling interval is in milliseconds).
MYSQL_TRIGGER_ALIASES: dict[str, tuple[tuple[str, ...], float]] = {
    "batch_size": (("MySql_Trigger_MaxBatchSize", "MySql_Trigger_BatchSize"), 1),
    "poll_interval": (("MySql_Trigger_PollingIntervalMs",), 0.001),
}

#: The knobs that may name a setting, with the range each allows (for the error).
KNOBS: dict[str, str] = {
    "batch_size": "a whole number of rows, 1 or more (e.g. 1000)",
    "time_budget": "a number of seconds above 0 (e.g. 240)",
    "max_attempts": "a whole number, 1 or more (e.g. 5)",
    "poll_interval": "a number of seconds above 0 (e.g. 1)",
}


class Knobs(BaseModel):
    """The knobs read from settings, as numbers (a field not read from a setting is ``None``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: PositiveInt | None = None
    time_budget: PositiveFloat | None = None
    max_attempts: PositiveInt | None = None
    poll_interval: PositiveFloat | None = None


def knob_settings(values: Mapping[str, Any], poller: str) -> dict[str, str]:
    """``{knob: setting name}`` of the knobs given as ``"%NAME%"``; a string that is not one
    reference raises ``ConfigurationError`` naming the knob and the forms it takes."""
    named: dict[str, str] = {}
    for knob, value in values.items():
        if not isinstance(value, str):
            continue
        name = setting_name(value)
        if name is None:
            raise ConfigurationError(
                f"Poller `{poller}`: `{knob}={value!r}` is neither a number nor an app setting "
                f'reference: pass {KNOBS[knob]}, or `"%NAME%"` to read it from the setting NAME.'
            )
        named[knob] = name
    return named


def resolve_knobs(
    named: Mapping[str, str], settings: Mapping[str, str], poller: str
) -> dict[str, Any]:
    """The numbers of the knobs read from settings, ``{knob: value}``. Every bad one is named in
    one ``ConfigurationError``: its setting, the value found and the range allowed."""
    if not named:
        return {}
    where = f"poller `{poller}`"
    missing = sorted({name for name in named.values() if name not in settings})
    if len(missing) == 1:
        setting_value(settings, missing[0], where)  # raises SettingNotFoundError, naming it
    if missing:
        raise ConfigurationError(
            f"Poller `{poller}` reads knobs from app settings that are not set: "
            + ", ".join(f"`{name}`" for name in missing)
            + ". Add them to the app settings (locally: `Values` in local.settings.json)."
        )
    raw = {knob: setting_value(settings, name, where).strip() for knob, name in named.items()}
    try:
        knobs = Knobs.model_validate(raw)
    except ValidationError as exc:
        bad = sorted({str(error["loc"][0]) for error in exc.errors()})
        lines = [
            f"`{knob}` from setting `{named[knob]}` is `{raw[knob]}`: use {KNOBS[knob]}"
            for knob in bad
        ]
        raise ConfigurationError(
            f"Poller `{poller}` reads knobs from app settings that are not valid: "
            + "; ".join(lines)
            + "."
        ) from None
    return {knob: getattr(knobs, knob) for knob in named}


def alias_knobs(
    defaults: Iterable[str], settings: Mapping[str, str], poller: str
) -> dict[str, tuple[Any, str]]:
    """The knobs of a MySQL poller left at their defaults (``defaults``) that Azure's MySQL
    trigger's settings set (:data:`MYSQL_TRIGGER_ALIASES`), ``{knob: (value, setting)}``, each
    logged (``setting_alias``). A bad value raises ``ConfigurationError`` naming the setting."""
    found: dict[str, tuple[Any, str]] = {}
    for knob in defaults:
        names, factor = MYSQL_TRIGGER_ALIASES.get(knob, ((), 1))
        name = next((n for n in names if settings.get(n, "").strip()), None)
        if name is None:
            continue
        raw = settings[name].strip()
        try:
            number = int(raw)
            if number < 1:
                raise ValueError(raw)
        except ValueError:
            raise ConfigurationError(
                f"Poller `{poller}` reads `{knob}` from Azure's MySQL trigger setting `{name}`, "
                f"which is `{raw}`: use a whole number above 0 (as the trigger does), or set "
                f"`{knob}=` on the poller."
            ) from None
        value = number if factor == 1 else number * factor
        found[knob] = (value, name)
        log_event(
            logger,
            logging.INFO,
            "setting_alias",
            poller=poller,
            knob=knob,
            setting=name,
            value=value,
        )
    return found
