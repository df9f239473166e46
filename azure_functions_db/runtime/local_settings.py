"""The app settings an ``afdb`` command reads, the way ``func start`` reads them.

``local.settings.json`` next to the app (its ``Values``), or the file ``--settings`` names; the
process environment on top (a real environment variable wins, as under Core Tools); and
``--state`` last. The result remembers where it read from, so a missing setting's error says
which sources were read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.runtime.settings import STATE_SETTING

#: The file ``func start`` reads next to ``function_app.py``.
LOCAL_SETTINGS = "local.settings.json"


class CommandSettings(dict[str, str]):
    """App settings with ``sources``: where they were read, in order (later ones win)."""

    sources: tuple[str, ...] = ()


def read_settings(
    app: str | Path | None,
    settings_file: str | Path | None = None,
    *,
    state: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> CommandSettings:
    """The settings of a command on ``app`` (a ``function_app.py`` or its folder).

    ``settings_file`` replaces ``local.settings.json`` next to the app (and must exist); the
    environment overrides either; ``state`` (``local`` or ``azure``) sets ``AFDB_STATE``.
    """
    values = CommandSettings()
    sources: list[str] = []
    path = _settings_path(app, settings_file)
    if path is not None:
        values.update(_values(path))
        sources.append(f"{path} (Values)")
    values.update(os.environ if environ is None else environ)
    sources.append("the environment")
    if state is not None:
        values[STATE_SETTING] = state
        sources.append("--state")
    values.sources = tuple(sources)
    return values


def export_settings(settings: CommandSettings) -> CommandSettings:
    """Put ``settings`` into this process's environment, as ``func start`` hands ``Values`` to
    the worker, so an app that reads ``os.environ`` at import sees them too; an environment
    variable already set keeps its value, ``--state`` sets ``AFDB_STATE``. For the CLI's own
    process only."""
    for name, value in settings.items():
        if name == STATE_SETTING and "--state" in settings.sources:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    return settings


def _settings_path(app: str | Path | None, settings_file: str | Path | None) -> Path | None:
    if settings_file is not None:
        path = Path(settings_file)
        if not path.is_file():
            raise ConfigurationError(
                f"`--settings {path}`: no such file. Name a local.settings.json-style file "
                '(`{"Values": {"NAME": "value"}}`), or leave the option out.'
            )
        return path
    if app is None:
        return None
    folder = Path(app) if Path(app).is_dir() else Path(app).parent
    path = folder / LOCAL_SETTINGS
    return path if path.is_file() else None


def _values(path: Path) -> dict[str, str]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"`{path}` cannot be read as JSON: {exc}") from None
    values = doc.get("Values", {}) if isinstance(doc, dict) else None
    if not isinstance(values, dict):
        raise ConfigurationError(f'`{path}` must hold an object `"Values": {{"NAME": "value"}}`.')
    out: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            out[str(name)] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[str(name)] = str(value)
        else:
            raise ConfigurationError(
                f"`{path}`: the value of `Values.{name}` must be a string (settings are text)."
            )
    return out
