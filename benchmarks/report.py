"""Turning results into output: a readable table per benchmark (``rich``) or one JSON document.

The JSON document is stable: ``schema`` names its version, keys are sorted, every benchmark
appears under its registered ``name`` with its metrics and ratios keyed by their ``key``. A later
benchmark adds keys; it never renames one.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from benchmarks.harness import BenchmarkResult, Context, Grid, Metric, Ratio, Scalar

SCHEMA = "afdb-bench/1"


@dataclass(frozen=True)
class Machine:
    """Where the numbers were taken."""

    python: str
    implementation: str
    platform: str
    cpu: str
    cpus: int
    sqlite: str
    sqlalchemy: str

    def to_json(self) -> dict[str, Scalar]:
        return {
            "python": self.python,
            "implementation": self.implementation,
            "platform": self.platform,
            "cpu": self.cpu,
            "cpus": self.cpus,
            "sqlite": self.sqlite,
            "sqlalchemy": self.sqlalchemy,
        }


@dataclass(frozen=True)
class RunInfo:
    """When the harness ran and how busy the machine was (other work skews the timings)."""

    started_at: dt.datetime
    seconds: float
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "seconds": round(self.seconds, 1),
            "load_average_start": [round(x, 2) for x in self.load_start],
            "load_average_end": [round(x, 2) for x in self.load_end],
        }


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (zeros where the OS has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def machine() -> Machine:
    """Describe this machine (CPU model from ``/proc/cpuinfo`` where there is one)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return Machine(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        platform=platform.platform(terse=True),
        cpu=cpu,
        cpus=os.cpu_count() or 0,
        sqlite=sqlite3.sqlite_version,
        sqlalchemy=sa.__version__,
    )


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def _number(value: float | int) -> float | int | None:
    """JSON has no NaN: a value that could not be computed is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _metric_json(metric: Metric) -> dict[str, Any]:
    return {
        "label": metric.label,
        "value": _number(metric.value),
        "unit": metric.unit,
        "detail": metric.detail,
    }


def _ratio_json(ratio: Ratio) -> dict[str, Any]:
    return {
        "label": ratio.label,
        "value": _number(round(ratio.value, 4)),
        "numerator": ratio.numerator,
        "denominator": ratio.denominator,
        "target": ratio.target,
    }


def _grid_json(grid: Grid) -> dict[str, Any]:
    return {
        "title": grid.title,
        "columns": list(grid.columns),
        "rows": {
            label: dict(zip(grid.columns, values, strict=True)) for label, values in grid.rows
        },
    }


def document(results: Sequence[BenchmarkResult], ctx: Context, info: RunInfo) -> dict[str, Any]:
    """The JSON document of one harness run."""
    return {
        "schema": SCHEMA,
        "run": info.to_json(),
        "machine": machine().to_json(),
        "config": {
            "rows": ctx.rows,
            "quick": ctx.quick,
            "repeats": ctx.repeats,
            "batch_size": ctx.batch_size,
        },
        "benchmarks": {
            result.name: {
                "title": result.title,
                "tier": result.tier,
                "status": result.status,
                "seconds": round(result.seconds, 3),
                "load_average": [_number(round(x, 2)) for x in result.load],
                "metrics": {m.key: _metric_json(m) for m in result.metrics},
                "ratios": {r.key: _ratio_json(r) for r in result.ratios},
                "grids": {g.key: _grid_json(g) for g in result.grids},
                "notes": list(result.notes),
            }
            for result in results
        },
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


def _bytes(value: float | int) -> str:
    if value >= 1024 * 1024:
        return f"{value / (1024 * 1024):,.1f} MiB"
    return f"{value / 1024:,.1f} KiB"


_FORMATS: dict[str, Callable[[float | int], str]] = {
    "bytes": _bytes,
    "rows/s": lambda value: f"{value:,.0f}",
    "s": lambda value: f"{value:,.3f}",
    "ms": lambda value: f"{value:,.1f}",
    "ratio": lambda value: f"{value:.2f}",
    "µs/row": lambda value: f"{value:.2f}",
}


def format_value(value: float | int, unit: str) -> str:
    """A number as a reader wants it: thousands separators, bytes in KiB/MiB, short floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    if unit in _FORMATS:
        return _FORMATS[unit](value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"


def _busy(info: RunInfo) -> bool:
    """More runnable work than the harness itself: another process competed for the CPUs."""
    cpus = os.cpu_count() or 1
    return max(info.load_start[0], info.load_end[0]) > cpus * 0.75 + 1


def render(
    results: Sequence[BenchmarkResult], ctx: Context, info: RunInfo, console: Console
) -> None:
    """Print one table per benchmark, its ratios, and its notes."""
    box = machine()
    console.print(
        f"[bold]azure-functions-db benchmarks[/bold]  N={ctx.rows:,} rows, batch "
        f"{ctx.batch_size}, best of {ctx.repeats}{'  (--quick)' if ctx.quick else ''}\n"
        f"Python {box.python} ({box.implementation}), {box.cpus} CPU ({box.cpu}), "
        f"SQLite {box.sqlite}, SQLAlchemy {box.sqlalchemy}, {box.platform}\n"
        f"{info.started_at:%Y-%m-%d %H:%M} UTC, {info.seconds:.1f} s, load average "
        f"{info.load_start[0]:.2f} at start, {info.load_end[0]:.2f} at end"
        f"{'  [yellow](busy machine: timings are skewed)[/yellow]' if _busy(info) else ''}"
    )
    for result in results:
        console.print()
        load = f", load {result.load[0]:.2f} -> {result.load[1]:.2f}"
        heading = (
            f"[bold]{result.title}[/bold]  [dim]{result.name} ({result.seconds:.1f} s{load})[/dim]"
        )
        if result.status != "ok":
            console.print(f"{heading}  [yellow]{result.status}[/yellow]")
            for note in result.notes:
                console.print(f"  {note}", highlight=False)
            continue
        console.print(heading)
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        table.add_column("measurement")
        table.add_column("value", justify="right")
        table.add_column("unit")
        table.add_column("detail", style="dim")
        for metric in result.metrics:
            table.add_row(
                metric.label, format_value(metric.value, metric.unit), metric.unit, metric.detail
            )
        console.print(table)
        if result.ratios:
            ratios = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            ratios.add_column("ratio")
            ratios.add_column("value", justify="right")
            ratios.add_column("target", style="dim")
            for ratio in result.ratios:
                ratios.add_row(ratio.label, format_value(ratio.value, "ratio"), ratio.target)
            console.print(ratios)
        for grid in result.grids:
            console.print(f"[italic]{grid.title}[/italic]")
            breakdown = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            breakdown.add_column("", no_wrap=True)
            for column in grid.columns:
                breakdown.add_column(column, justify="right")
            for label, values in grid.rows:
                breakdown.add_row(label, *("" if v is None else str(v) for v in values))
            console.print(breakdown)
        for note in result.notes:
            console.print(f"  - {note}", highlight=False)
    _render_goals(results, console)


_GOAL = re.compile(r">=\s*([0-9]*\.?[0-9]+)")


def goal_of(target: str) -> float | None:
    """The threshold of a ratio's target (``"issue 31: >= 0.85"`` -> 0.85), if it states one
    for this ratio (a target quoted for another tier, "not this tier", is not its goal)."""
    if "not this tier" in target:
        return None
    found = _GOAL.search(target)
    return float(found.group(1)) if found else None


def _render_goals(results: Sequence[BenchmarkResult], console: Console) -> None:
    """Every ratio with a stated goal, one table: value, goal, met or not, and the load average
    of its benchmark (a goal missed on a busy machine is measured again on a quiet one)."""
    rows = [
        (result, ratio, goal)
        for result in results
        for ratio in result.ratios
        if (goal := goal_of(ratio.target)) is not None
    ]
    if not rows:
        return
    console.print()
    console.print("[bold]Goals[/bold]  [dim]every ratio with a target, measured above[/dim]")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("benchmark")
    table.add_column("ratio")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    table.add_column("")
    table.add_column("load", style="dim")
    for result, ratio, goal in rows:
        met = math.isfinite(ratio.value) and ratio.value >= goal
        table.add_row(
            result.name,
            ratio.label,
            format_value(ratio.value, "ratio"),
            f">= {goal:g}",
            "[green]met[/green]" if met else "[red]missed[/red]",
            f"{result.load[0]:.2f} -> {result.load[1]:.2f}",
        )
    console.print(table)
