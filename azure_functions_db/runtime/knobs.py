"""Tuning knobs read from app settings: ``batch_size="%ORDERS_BATCH%"``.

Like the SQL trigger's ``Sql_Trigger_MaxBatchSize``, a poller's ``batch_size``, ``time_budget``,
``max_attempts`` and ``poll_interval`` may name an app setting instead of holding a number, so an
operator changes them without a redeploy (changing an app setting restarts the app). The
decorator only checks that such a value is one ``%NAME%`` reference; the setting is read when the
poller's engine is made (its first run in a process), by :func:`resolve_knobs`, which validates
every knob at once with one pydantic model and raises one error naming each bad setting, its
value and the allowed range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, ValidationError

from azure_functions_db.core.settings import setting_name, setting_value
from azure_functions_db.errors import ConfigurationError

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
