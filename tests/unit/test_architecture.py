"""The dependency rule of STYLE.md, checked on the source text.

``core`` imports only the standard library (and, in ``config.py``, pydantic), ``ports``,
``errors`` and itself; only ``functions`` imports ``azure.functions``; adapters never import the
layers above them.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "azure_functions_db"


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_core_is_pure(path):
    allowed_own = (
        "azure_functions_db.core",
        "azure_functions_db.core.ports",
        "azure_functions_db.errors",
    )
    # pydantic (pure, no I/O) is the design's library for configuration models: the poller's
    # rules (core/config.py) and nothing else in core.
    validation = ("pydantic", "pydantic_core") if path.name == "config.py" else ()
    for name in imports_of(path):
        top = name.split(".")[0]
        if name.startswith("azure_functions_db"):
            assert name.startswith(allowed_own), f"{path.name} imports {name}"
        else:
            assert top in sys.stdlib_module_names or top in validation, (
                f"core/{path.name} imports {name}"
            )


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_core_reads_no_clock_and_no_environment(path):
    """Only ``core/clock.py`` (the :class:`SystemClock` handed to everything else) reads time."""
    text = path.read_text()
    clocks = ("datetime.now(", "dt.datetime.now(", "time.time(", "time.monotonic(", "time.sleep(")
    forbidden = ("os.environ", "getenv(") + (() if path.name == "clock.py" else clocks)
    for name in forbidden:
        assert name not in text, f"core/{path.name} uses {name}"


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_core_does_no_io(path):
    """No files, sockets, processes or network in core: it computes, the adapters do I/O."""
    io_modules = {"socket", "subprocess", "shutil", "pathlib", "io", "urllib", "http", "ssl"}
    for name in imports_of(path):
        assert name.split(".")[0] not in io_modules, f"core/{path.name} imports {name}"
    tree = ast.parse(path.read_text())
    calls = [
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    ]
    assert "open" not in calls, f"core/{path.name} opens a file"


def test_the_one_clock_module_holds_the_protocol_and_the_system_clock():
    from azure_functions_db.core.clock import Clock, SystemClock

    clock: Clock = SystemClock()
    assert clock.monotonic() <= clock.monotonic()
    assert not (PACKAGE / "clock.py").exists()


def test_only_the_functions_package_imports_azure_functions():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "functions" not in p.relative_to(PACKAGE).parts[:1]
        and any(n == "azure.functions" or n.startswith("azure.functions.") for n in imports_of(p))
    ]
    assert offenders == []


@pytest.mark.parametrize("folder", ["sinks", "sources", "state"])
def test_adapters_do_not_import_the_layers_above(folder):
    above = (
        "azure_functions_db.functions",
        "azure_functions_db.cli",
        "azure_functions_db.spark",
        "azure_functions_db.runtime",
        "azure_functions_db.ops",
        "azure_functions_db.observers",
    )
    for path in modules(folder):
        for name in imports_of(path):
            assert not name.startswith(above), f"{folder}/{path.name} imports {name}"


def test_modules_stay_small():
    big = [
        f"{p.relative_to(PACKAGE)} ({n} lines)"
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    ]
    assert big == []


def test_every_error_class_lives_in_errors_py():
    """Public errors, that is: a module may keep a private control-flow exception."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            ]
            if any(b.endswith(("Error", "Exception", "Unavailable")) for b in bases):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert offenders == []


def _poller_errors() -> list[Exception]:
    from azure_functions_db import errors as e

    return [
        e.CheckpointConflictError("p", "n", expected_etag="a", found_etag="b"),
        e.RecordExistsError("p", "n"),
        e.CheckpointCorruptError("p", "n", "x"),
        e.PositionRegressionError("p", "1", "2", "n"),
        e.LeaseLostError("p", "n", 1),
        e.FenceBehindCheckpointError("p", "n", 1, 2),
        e.LeaseHeldError("p", "n", None),
        e.HandlerError("p", "n", 1, 1),
        e.PoisonBatchError("p", "n", 5, 1),
        e.UnexpectedRunError("p", RuntimeError("x"), "n"),
        e.StaleFenceError("p", "n", stored=2, mine=1),
        e.PositionNotForwardError("p", "n", stored=None, proposed="b", read_after=None),
    ]


@pytest.mark.parametrize("error", _poller_errors(), ids=lambda e: type(e).__name__)
def test_an_error_about_a_poller_carries_it_on_the_one_base(error):
    from azure_functions_db.errors import AfdbError

    assert isinstance(error, AfdbError)
    assert (error.poller, error.namespace) == ("p", "n")
    assert "`p`" in str(error) or "n/p" in str(error)


def test_the_claim_sequence_exists_once():
    """Acquire -> fence -> compare-and-set is ``core/claim.py``; the engine, ``seek``, the
    backfill's live seed and its chunks' done markers all go through it."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("state", "testing") or rel.as_posix() == "core/claim.py":
            continue
        text = path.read_text()
        offenders.extend(
            f"{rel}: {c}" for c in (".acquire(", ".fenced(", "LeaseKeeper(") if c in text
        )
    assert offenders == []


def test_the_top_level_is_grouped_by_role():
    """Only the public surface, the error module and the CLI entry points sit at the top; every
    other module lives in the package of its role."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py", "errors.py"]
    roles = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert roles == [
        "core",
        "functions",
        "observers",
        "ops",
        "runtime",
        "sinks",
        "sources",
        "spark",
        "state",
        "testing",
    ]


def _imported_names(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n.startswith("azure_functions_db.")]


def test_no_module_imports_another_packages_private_module():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        home = rel.parts[0] if len(rel.parts) > 1 else ""
        for name in _imported_names(path):
            parts = name.split(".")[1:]
            private = any(p.startswith("_") and not p.startswith("__") for p in parts)
            if private and parts[0] != home:
                offenders.append(f"{rel} imports {name}")
    assert offenders == []


def test_the_package_has_no_import_cycle():
    """Module-level imports between the package's modules form no cycle (lazy imports inside
    functions, which break cycles on purpose, are not counted)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        module = ".".join(("azure_functions_db", *rel.parts)).removesuffix(".__init__")
        tree = ast.parse(path.read_text(), str(path))
        deps: set[str] = set()
        for node in tree.body:  # top level only
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[module] = {d for d in deps if d.startswith("azure_functions_db")}
    modules = set(graph)
    edges = {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}
    # Importing a submodule imports its packages first, but a package's own __init__ importing
    # its children is not a cycle with them: drop child -> ancestor-package edges.
    for m, deps in edges.items():
        edges[m] = {d for d in deps if not m.startswith(d + ".")}
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (as a path back to its start), or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_no_false_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_architecture_page_matches_the_tree():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    tree = page.split("```")[1]
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert f"  {folder.name}/" in tree, f"docs/architecture.md does not show {folder.name}/"
        for module in folder.glob("*.py"):
            public = not module.name.startswith("_")
            assert not public or module.name in tree, f"{folder.name}/{module.name} not shown"
    for module in PACKAGE.glob("*.py"):
        assert module.name in tree or module.name == "__main__.py", module.name


def test_operator_use_cases_return_data_and_only_the_cli_prints():
    printers = [
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / "ops").rglob("*.py")
        if any(n.split(".")[0] == "rich" for n in imports_of(p))
        or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]
    assert printers == []
