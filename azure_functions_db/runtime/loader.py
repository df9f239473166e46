"""Load a ``function_app.py`` (or ``module:attr``) and find its pollers, with no Functions host."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.functions.blueprint import PollerBlueprint
from azure_functions_db.runtime.poller import PollerDefinition


def load_pollers(spec: str) -> dict[str, PollerDefinition]:
    """Pollers defined by ``spec``: a file, a directory holding ``function_app.py``, a module
    name, or ``module:attr`` naming a ``PollerBlueprint`` (or anything in a module that has them).

    Importing the app does no I/O (the decorator only records configuration), so a missing
    table never stops the import: each poller's run, ``afdb validate`` and ``afdb run`` at its
    start report it for that poller.
    """
    module, attr = _import(spec)
    if attr is not None:
        target = getattr(module, attr, None)
        if target is None:
            raise ConfigurationError(f"`{spec}`: module `{module.__name__}` has no `{attr}`")
        if isinstance(target, PollerBlueprint):
            return dict(target.pollers)
    pollers: dict[str, PollerDefinition] = {}
    for value in list(vars(module).values()):
        if isinstance(value, PollerBlueprint):
            for name, definition in value.pollers.items():
                if name in pollers and pollers[name] is not definition:
                    raise ConfigurationError(f"`{spec}` defines poller `{name}` twice")
                pollers[name] = definition
    if not pollers:
        raise ConfigurationError(
            f"`{spec}` defines no pollers: expected a module-level `afdb.PollerBlueprint()` "
            "with at least one `@db.poller(...)` handler."
        )
    return pollers


def _import(spec: str) -> tuple[ModuleType, str | None]:
    text, _, attr = spec.partition(":")
    path = Path(text)
    if path.is_dir():
        path = path / "function_app.py"
    if path.suffix == ".py":
        if not path.is_file():
            raise ConfigurationError(f"App file `{path}` does not exist")
        return _import_file(path.resolve()), attr or None
    try:
        return importlib.import_module(text), attr or None
    except ImportError as exc:
        raise ConfigurationError(
            f"Cannot import `{text}` ({exc}); pass a path to function_app.py or `module:attr`."
        ) from exc


def _import_file(path: Path) -> ModuleType:
    # The app's folder goes on sys.path, as the Functions host does, so its own imports work.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.stem not in sys.modules else f"_afdb_app_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"Cannot load `{path}` as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
