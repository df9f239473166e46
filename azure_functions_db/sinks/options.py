"""The sinks' configuration models (pydantic), and their errors in the package's own words.

A bad option raises :class:`~azure_functions_db.errors.ConfigurationError` naming the option,
the value and the fix, at construction (at decoration, no I/O), never pydantic's report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from azure_functions_db.errors import ConfigurationError

M = TypeVar("M", bound=BaseModel)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def build(model: type[M], **values: Any) -> M:
    """``model`` validated from ``values``; the first problem as a ``ConfigurationError``."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = str(error["loc"][0]) if error["loc"] else model.__name__
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] != "value_error":
            message = f"`{option}={values.get(option)!r}` is not usable: {message.lower()}"
        raise ConfigurationError(f"{model.__name__}: {message}") from None


class SqlSinkOptions(BaseModel):
    """What :class:`~azure_functions_db.sinks.sql.SqlSink` is given (checked without I/O)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    url: str
    position_table: str = "afdb_positions"
    db_schema: str | None = Field(default=None, alias="schema")
    engine_options: dict[str, Any] = Field(default_factory=dict)
    connect_timeout: float = 10.0

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(
                "`url` is empty: pass the target database's SQLAlchemy URL, e.g. "
                '`url="%TARGET_DB_URL%"` to read it from an app setting.'
            )
        return value

    @field_validator("position_table", "db_schema")
    @classmethod
    def _name(cls, value: str | None, info: Any) -> str | None:
        option = "schema" if info.field_name == "db_schema" else info.field_name
        if value is not None and not _NAME.match(value):
            raise ValueError(
                f"`{option}={value!r}` is not a plain SQL name: use 1-63 letters, digits or `_`, "
                'starting with a letter or `_` (e.g. `"afdb_positions"`).'
            )
        return value

    @field_validator("engine_options", mode="before")
    @classmethod
    def _engine_options(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(
                f"`engine_options={value!r}` must be a mapping of `sqlalchemy.create_engine` "
                "arguments, e.g. `{'pool_size': 5}`."
            )
        return dict(value)

    @field_validator("connect_timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
            raise ValueError(
                f"`connect_timeout={value!r}` must be a number of seconds between 0 and 3600 "
                "(e.g. `connect_timeout=10`)."
            )
        return float(value)


class DeltaSinkOptions(BaseModel):
    """What :class:`~azure_functions_db.sinks.delta.DeltaSink` is given (checked without I/O)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    key: tuple[str, ...] | None = None
    storage_options: dict[str, str] = Field(default_factory=dict)

    @field_validator("uri", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f'`uri={value!r}` must be the table\'s location, e.g. `uri="./lake/orders"` or '
                '`uri="abfss://lake@account.dfs.core.windows.net/orders"` (or `"%SETTING%"`).'
            )
        return value

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        if value is None:
            return None
        names = [value] if isinstance(value, str) else value
        if (
            not isinstance(names, list | tuple)
            or not names
            or not all(isinstance(n, str) and n.strip() == n and n for n in names)
            or len(set(names)) != len(names)
        ):
            raise ValueError(
                f"`key={value!r}` must name the columns that identify a row, e.g. "
                '`key=["id"]`, each once.'
            )
        return tuple(names)

    @field_validator("storage_options", mode="before")
    @classmethod
    def _storage(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError(
                "`storage_options` must map option names to strings, e.g. "
                '`{"azure_storage_account_name": "%LAKE_ACCOUNT%"}`.'
            )
        return dict(value)
