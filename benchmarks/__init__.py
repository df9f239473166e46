"""Benchmarks of azure-functions-db: measurements against a baseline taken in the same run.

Run ``make bench`` (``python -m benchmarks``); ``--quick`` for a small table, ``--json`` for a
machine-readable document, ``--only NAME`` for one benchmark, ``--list`` for their names.
Nothing here asserts on a time: these are measurements, not tests. ``docs/performance.md`` holds
the method and the latest numbers.

Layout: :mod:`benchmarks.harness` (context, result model, timing), :mod:`benchmarks.report`
(table and JSON output), :mod:`benchmarks.registry` (what runs), one module per benchmark named
``<tier>_<what>.py``, and one fixture module per tier (:mod:`benchmarks.sqlite_fixture`).
"""
