"""Database URLs: ``%SETTING%`` placeholders, parsing, and masking every secret they hold.

Shared by the sources and the sinks: a URL is resolved when its owner opens (never at import),
and only its masked form ever reaches a log line or an error message.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.core.settings import setting_value
from azure_functions_db.errors import ConfigurationError

PLACEHOLDER = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)%")
_HEX_PAIR = re.compile(r"[0-9A-Fa-f]{2}")


def placeholders(text: str, settings: Mapping[str, str] | None = None) -> list[re.Match[str]]:
    """The ``%NAME%`` setting references in ``text``, left to right; never a percent-escape.

    A URL may be percent-encoded (``p%C3%A4ss`` is ``päss``), and ``%C3%`` or ``%A4ss%`` look
    like references. In a percent-encoded text every ``%`` is followed by two hex digits, so a
    candidate whose name starts with two hex digits is an escape when its closing ``%`` is
    followed by two hex digits too, unless the name is a setting that exists (``%C3%A4``,
    ``%A4ss%40``: escapes; ``%DB_URL%``, or ``%DB%`` before ``@``, ``/``, ``?`` or the end:
    references, reported when the setting is missing). A literal ``%NAME%`` is written with
    its ``%`` signs encoded: ``%25NAME%25``.
    """
    found: list[re.Match[str]] = []
    at = 0
    while (match := PLACEHOLDER.search(text, at)) is not None:
        if _is_escape(match, text, settings):
            at = match.start() + 3  # past the `%HH`
            continue
        found.append(match)
        at = match.end()
    return found


def _is_escape(match: re.Match[str], text: str, settings: Mapping[str, str] | None) -> bool:
    name = match.group(1)
    if not _HEX_PAIR.match(name) or (settings is not None and name in settings):
        return False
    return bool(_HEX_PAIR.match(text, match.end()))


def substitute(text: str, found: list[re.Match[str]], value: Callable[[str], str]) -> str:
    """``text`` with each reference of ``found`` (from :func:`placeholders`) replaced by
    ``value(name)``."""
    parts: list[str] = []
    at = 0
    for match in found:
        parts.extend((text[at : match.start()], value(match.group(1))))
        at = match.end()
    parts.append(text[at:])
    return "".join(parts)


def resolve_settings(template: str, settings: Mapping[str, str], where: str) -> str:
    """``template`` with every ``%NAME%`` replaced by ``settings[NAME]`` (one pass; a
    percent-escape such as ``%C3`` is left as it is, see :func:`placeholders`)."""
    return substitute(
        template,
        placeholders(template, settings),
        lambda name: setting_value(settings, name, where),
    )


_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def url_template(url: str | sa.URL | None, connection: str | None, owner: str) -> str | sa.URL:
    """The database URL an owner was given: ``url=`` (text with ``%NAME%`` placeholders, or a
    ``sqlalchemy.URL``) or ``connection=`` (the name of a setting holding the whole URL), not
    both. Raises ``ConfigurationError`` naming the bad value and the fix."""
    if connection is not None:
        if url is not None:
            raise ConfigurationError(
                f"{owner}: pass `url=` or `connection=`, not both (`connection=` names a setting "
                "that holds the whole URL)."
            )
        if not isinstance(connection, str) or not _SETTING_NAME.fullmatch(connection):
            raise ConfigurationError(
                f"{owner}: `connection={connection!r}` must be the name of an app setting "
                'holding the database URL, e.g. `connection="ORDERS_DB"`.'
            )
        return f"%{connection}%"
    if isinstance(url, sa.URL):
        return url
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"{owner}: `url={url!r}` is not a database URL. Pass a SQLAlchemy URL (text or "
            '`sqlalchemy.URL`), a setting reference such as `url="%ORDERS_DB_URL%"`, or '
            '`connection="ORDERS_DB"` (a setting holding the whole URL).'
        )
    return url


def resolve_url(template: str | sa.URL, settings: Mapping[str, str], what: str) -> sa.URL:
    """The database URL ``template`` with its ``%NAME%`` settings in place, as a URL object.

    - A ``sqlalchemy.URL`` is taken as it is (its parts are separate already).
    - A template that is one placeholder alone (``"%ORDERS_DB%"``) names a setting that holds a
      whole URL, parsed as such (the platform's convention, as the SQL trigger's
      ``connection_string_setting``).
    - Otherwise each value goes into the part of the URL its placeholder stands in (driver, user,
      password, host, database, a query key or value) as that part's own text, never as URL
      syntax: ``%PW%`` = ``p@ss/w#rd`` stays the password, it does not end the host. A URL that
      parses only with the values pasted in (a placeholder for the port) is parsed that way.

    ``what`` names the URL's owner in errors, which name settings, never their values.
    """
    if isinstance(template, sa.URL):
        return template
    text = template.strip()
    found = placeholders(text, settings)
    if len(found) == 1 and found[0].group(0) == text:
        return parse_url(resolve_settings(text, settings, what), what)
    names = [m.group(1) for m in found]
    values = {name: setting_value(settings, name, what) for name in names}
    tokens = {f"afdbsetting{i}x": name for i, name in enumerate(dict.fromkeys(names))}
    tokenized = substitute(text, found, lambda name: _token_of(tokens, name))
    if several_at_signs(tokenized):
        parse_url(tokenized, what)  # raises, naming nothing of the URL
    try:
        url = sa.make_url(tokenized)
    except (sa_exc.ArgumentError, ValueError):
        return parse_url(resolve_settings(text, settings, what), what)

    def put(part: str | None) -> str | None:
        if part is None:
            return None
        for token, name in tokens.items():
            part = part.replace(token, values[name])
        return part

    query: dict[str, str | tuple[str, ...]] = {}
    for key, value in url.query.items():
        items = tuple(put(v) or "" for v in ((value,) if isinstance(value, str) else value))
        query[put(key) or key] = items[0] if isinstance(value, str) else items
    resolved = url.set(
        drivername=put(url.drivername) or url.drivername,
        username=put(url.username),
        password=put(url.password if isinstance(url.password, str) else None),
        host=put(url.host),
        database=put(url.database),
        query=query,
    )
    return resolved


def _token_of(tokens: Mapping[str, str], name: str) -> str:
    return next(token for token, named in tokens.items() if named == name)


def parse_url(text: str, what: str) -> sa.URL:
    """``text`` as a SQLAlchemy URL; the error repeats neither the text nor the parser's words.

    ``what`` names the URL's owner in the error, e.g. ``the source of table `orders```. An
    ADO.NET connection string (``Server=...;Database=...;Uid=...;Pwd=...``, what the Azure
    portal and the Functions SQL/MySQL triggers use) is converted (:func:`from_ado_net`).
    """
    if "://" not in text and _ADO_PAIR.match(text):
        return from_ado_net(text, what)
    if several_at_signs(text):
        raise ConfigurationError(
            f"The database URL of {what} has more than one `@` before its host, so its user or "
            "password holds an `@` that is not percent-encoded, and any reading of it would put "
            "part of the password into the host or the database name. Percent-encode the user "
            "and password (`@` is `%40`, `#` is `%23`, `/` is `%2F`, `%` is `%25`), or give "
            'them as settings of their own: `url="mysql+pymysql://%DB_USER%:%DB_PASSWORD%@'
            'host:3306/db"`. (Nothing of the URL is shown here: it holds a secret.)'
        )
    try:
        return sa.make_url(text)
    except (sa_exc.ArgumentError, ValueError):
        raise ConfigurationError(
            f"The database URL of {what} cannot be parsed. Expected a "
            "SQLAlchemy URL such as `postgresql+psycopg://user:password@host:5432/db`."
        ) from None


def several_at_signs(text: str) -> bool:
    """Whether ``text`` has more than one ``@`` between its ``://`` and its query: a user or
    password with an unencoded ``@``, which no parser can split where the user meant."""
    _, sep, rest = text.partition("://")
    return bool(sep) and rest.partition("?")[0].count("@") > 1


# Secrets in a URL beyond its password: query parameters with these names, and the values of
# `PWD=`/`Password=` in an ODBC connection string passed whole as `odbc_connect=` (pyodbc).
_SECRET_KEYS = frozenset({"password", "pwd"})
_ODBC_SECRET = re.compile(r"(?i)((?:^|;)\s*(?:pwd|password)\s*=\s*)(\{(?:[^}]|\}\})*\}|[^;]*)")
_MASK = "***"


def render_masked(url: sa.URL) -> str:
    """``url`` as text with its password, secret query parameters and ODBC ``PWD`` masked."""
    query: dict[str, str | tuple[str, ...]] = {}
    for key, value in url.query.items():
        values = (value,) if isinstance(value, str) else value
        if key.lower() in _SECRET_KEYS:
            values = tuple(_MASK for _ in values)
        elif key.lower() == "odbc_connect":
            values = tuple(_ODBC_SECRET.sub(rf"\g<1>{_MASK}", v) for v in values)
        query[key] = values[0] if len(values) == 1 else values
    text = url.set(query=query).render_as_string(hide_password=True)
    return text.replace("%2A%2A%2A", _MASK)


def url_secrets(url: sa.URL) -> tuple[str, ...]:
    """Every secret of ``url`` in each form it may take in a driver's message, longest first.

    Raw, URL-encoded (``quote_plus`` and ``quote``), and as an ODBC connection string writes it
    (a braced value doubles its ``}``), so a message that repeats a URL or connection string
    can be scrubbed.
    """
    values = [url.password] if url.password else []
    for key, value in url.query.items():
        for item in (value,) if isinstance(value, str) else value:
            if key.lower() in _SECRET_KEYS:
                values.append(item)
            elif key.lower() == "odbc_connect":
                for match in _ODBC_SECRET.finditer(item):
                    secret = match.group(2).strip()
                    if secret.startswith("{") and secret.endswith("}"):
                        secret = secret[1:-1].replace("}}", "}")
                    values.append(secret)
    forms: set[str] = set()
    for value in filter(None, values):
        for written in (value, value.replace("}", "}}")):
            forms.update(
                (written, urllib.parse.quote_plus(written), urllib.parse.quote(written, safe=""))
            )
    return tuple(sorted(forms, key=len, reverse=True))


def masked_url(template: str | sa.URL) -> str:
    """``template`` with any literal password masked, placeholders shown as written."""
    if isinstance(template, sa.URL):
        return render_masked(template)
    found = placeholders(template)
    tokens = {f"afdbsetting{i}x": m.group(0) for i, m in enumerate(found)}
    numbered = iter(tokens)
    text = substitute(template, found, lambda _: next(numbered))
    if several_at_signs(text):
        return "<database url>"  # its parts cannot be told apart: show none of them
    try:
        text = render_masked(sa.make_url(text))
    except (sa_exc.ArgumentError, ValueError):
        if set(substitute(template, found, lambda _: "").strip()) - {""}:
            return "<database url>"
        return template
    for token, placeholder in tokens.items():
        text = text.replace(token, placeholder)
    return text


# ADO.NET connection strings: `Key=Value;...`, keys case-insensitive, as the Azure portal writes
# them for Azure Database for MySQL (MySqlConnector), PostgreSQL (Npgsql) and Azure SQL.
_ADO_PAIR = re.compile(r"\s*[A-Za-z][A-Za-z ]*=")
_ADO_KEYS = {
    "host": ("server", "host", "data source", "address", "addr", "network address"),
    "port": ("port",),
    "database": ("database", "initial catalog"),
    "username": ("uid", "user id", "userid", "user", "username", "user name"),
    "password": ("pwd", "password"),
}
_ADO_DRIVERS = {3306: "mysql+pymysql", 5432: "postgresql+psycopg", 1433: "mssql+pyodbc"}


def from_ado_net(text: str, what: str) -> sa.URL:
    """The SQLAlchemy URL of an ADO.NET connection string, each value in its own part (a
    password with ``;`` must be quoted as ADO.NET quotes it: ``Pwd="a;b"``).

    The dialect is the one its keys or port say: ``Initial Catalog``, ``tcp:`` or port 1433
    for SQL Server (the ODBC Driver 18); ``Host``/``Username`` or port 5432 for PostgreSQL;
    ``Uid``/``SslMode`` or port 3306 for MySQL. Otherwise the error says which key to add."""
    pairs: dict[str, str] = {}
    for part in _ado_parts(text):
        key, sep, value = part.partition("=")
        if sep:
            pairs[key.strip().lower()] = value.strip()
    found = {
        name: next((pairs[k] for k in keys if k in pairs), None) for name, keys in _ADO_KEYS.items()
    }
    host = found["host"] or ""
    port_text = found["port"]
    if host.lower().startswith("tcp:"):
        host = host[4:]
    if "," in host:  # SQL Server: `host,port`
        host, _, port_text = host.partition(",")
    try:
        port = int(port_text) if port_text else None
    except ValueError:
        raise ConfigurationError(
            f"The ADO.NET connection string of {what} has port `{port_text}`: a number is needed."
        ) from None
    drivername = _ado_driver(pairs, port, found["host"] or "")
    if drivername is None:
        raise ConfigurationError(
            f"The ADO.NET connection string of {what} does not say which database it is for: add "
            "`Port=3306` (MySQL), `Port=5432` (PostgreSQL) or `Port=1433` (SQL Server), or give a "
            "SQLAlchemy URL such as `mysql+pymysql://user:password@host:3306/db`."
        )
    query = {"driver": "ODBC Driver 18 for SQL Server"} if drivername == "mssql+pyodbc" else {}
    return sa.URL.create(
        drivername,
        username=found["username"],
        password=found["password"],
        host=host or None,
        port=port,
        database=found["database"],
        query=query,
    )


def _ado_driver(pairs: Mapping[str, str], port: int | None, server: str) -> str | None:
    if "initial catalog" in pairs or server.lower().startswith("tcp:") or port == 1433:
        return "mssql+pyodbc"
    if port in _ADO_DRIVERS:
        return _ADO_DRIVERS[port]
    if "host" in pairs or "username" in pairs:
        return "postgresql+psycopg"
    if "uid" in pairs or "sslmode" in pairs or "ssl mode" in pairs:
        return "mysql+pymysql"
    return None


def _ado_parts(text: str) -> list[str]:
    """``text`` split at the ``;`` outside double or single quotes, quotes removed."""
    parts, current, quote = [], [], ""
    for char in text:
        if quote:
            if char == quote:
                quote = ""
            else:
                current.append(char)
        elif (char in "\"'" and current and current[-1] == "=") or (
            char in "\"'" and "".join(current).rstrip().endswith("=")
        ):
            quote = char
        elif char == ";":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]
