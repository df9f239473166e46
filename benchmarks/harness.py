"""The pieces every benchmark shares: the run context, the result model and timing helpers.

A benchmark is a :class:`Benchmark` value (name, title, tier, ``run`` function) exported as
``BENCHMARK`` by its own module. ``run`` receives a :class:`Context` and returns a
:class:`BenchmarkResult` of :class:`Metric` and :class:`Ratio` values; it never asserts on a time.
A benchmark whose service is missing raises :class:`BenchmarkSkipped` with the reason.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, cast

T = TypeVar("T")

#: A JSON scalar, the only kind of value a metric or a note detail may hold.
Scalar = int | float | str | bool | None

#: Spinner/progress output goes through this callable (stderr), never to stdout.
Progress = Callable[[str], None]


class BenchmarkSkipped(Exception):
    """The benchmark cannot run here (a service or an optional extra is missing); say why."""


@dataclass(frozen=True)
class Metric:
    """One measured value.

    Attributes:
        key: Stable identifier used in the JSON document and by :class:`Ratio` (``engine_rps``).
        label: What a reader sees in the table.
        value: The number (a count, a rate, a size).
        unit: ``rows/s``, ``s``, ``count``, ``bytes``, ...
        detail: A short free-text qualifier (``best of 3``, ``200000 rows``).
    """

    key: str
    label: str
    value: float | int
    unit: str
    detail: str = ""


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` of two metrics of the same result, with the target if any."""

    key: str
    label: str
    numerator: str
    denominator: str
    value: float
    target: str = ""


@dataclass(frozen=True)
class Grid:
    """A small matrix for a breakdown (per scenario x per counter); rows are (label, values)."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[Scalar, ...]], ...]

    def __post_init__(self) -> None:
        for label, values in self.rows:
            if len(values) != len(self.columns):
                raise ValueError(f"row `{label}` of grid `{self.key}` does not fit its columns")


@dataclass
class BenchmarkResult:
    """What one benchmark measured; filled with :meth:`metric` and :meth:`ratio`."""

    name: str
    title: str
    tier: str
    status: Literal["ok", "skipped"] = "ok"
    seconds: float = 0.0
    metrics: list[Metric] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    grids: list[Grid] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The 1-minute load average when the benchmark started and ended (set by the harness).
    load: tuple[float, float] = (math.nan, math.nan)

    def metric(
        self, key: str, label: str, value: float | int, unit: str, detail: str = ""
    ) -> Metric:
        """Record a metric; keys are unique within a result."""
        if any(m.key == key for m in self.metrics):
            raise ValueError(f"duplicate metric key `{key}` in benchmark `{self.name}`")
        measured = Metric(key=key, label=label, value=value, unit=unit, detail=detail)
        self.metrics.append(measured)
        return measured

    def value(self, key: str) -> float | int:
        """The value of the metric ``key``."""
        for measured in self.metrics:
            if measured.key == key:
                return measured.value
        raise KeyError(f"no metric `{key}` in benchmark `{self.name}`")

    def ratio(
        self, key: str, label: str, numerator: str, denominator: str, target: str = ""
    ) -> Ratio:
        """Record ``metric(numerator) / metric(denominator)``."""
        below = self.value(denominator)
        value = float(self.value(numerator)) / float(below) if below else float("nan")
        made = Ratio(
            key=key,
            label=label,
            numerator=numerator,
            denominator=denominator,
            value=value,
            target=target,
        )
        self.ratios.append(made)
        return made

    def grid(
        self,
        key: str,
        title: str,
        columns: tuple[str, ...],
        rows: list[tuple[str, tuple[Scalar, ...]]],
    ) -> Grid:
        """Record a breakdown table."""
        made = Grid(key=key, title=title, columns=columns, rows=tuple(rows))
        self.grids.append(made)
        return made

    def note(self, text: str) -> None:
        """A sentence a reader needs to interpret the numbers honestly."""
        self.notes.append(text)


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: its stable ``name``, a title, the service tier, the function."""

    name: str
    title: str
    tier: str
    run: Callable[[Context], BenchmarkResult]


@dataclass
class Context:
    """What a run of the harness gives every benchmark.

    Attributes:
        rows: The full table size N (``--quick`` makes it small).
        repeats: Repetitions per timed measurement; the best is reported.
        batch_size: Rows per batch for every scan and for the engine.
        workdir: A scratch directory removed when the harness exits.
        progress: Where to say what is running (stderr).
    """

    rows: int
    repeats: int
    batch_size: int
    workdir: Path
    progress: Progress
    quick: bool = False
    _memo: dict[str, object] = field(default_factory=dict)

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """Build a shared fixture or measurement once per harness run (tables, drains)."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(T, self._memo[key])

    def memoized(self, key: str) -> object | None:
        """What :meth:`memo` holds under ``key``, or ``None`` if nothing was built yet."""
        return self._memo.get(key)


@dataclass(frozen=True)
class Timing:
    """The best of several timed repetitions of work over ``rows`` rows."""

    rows: int
    seconds: float
    repeats: int
    all_seconds: tuple[float, ...]

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def timed(work: Callable[[], int]) -> tuple[int, float]:
    """Run ``work`` once; return the rows it reported and the wall time (``perf_counter``)."""
    started = time.perf_counter()
    rows = work()
    return rows, time.perf_counter() - started


def best_of(samples: list[tuple[int, float]]) -> Timing:
    """The fastest of repetitions that all processed the same number of rows."""
    counts = {rows for rows, _ in samples}
    if len(counts) != 1:
        raise RuntimeError(f"repetitions processed different row counts: {sorted(counts)}")
    seconds = tuple(s for _, s in samples)
    return Timing(
        rows=counts.pop(), seconds=min(seconds), repeats=len(seconds), all_seconds=seconds
    )
