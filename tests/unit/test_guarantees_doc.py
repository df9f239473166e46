"""docs/guarantees.md names real tests, and every failure-matrix case has a row."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guarantees.md"
NODE_ID = re.compile(r"`(tests/[\w/]+\.py::[^`]+)`")


def node_ids() -> list[str]:
    return sorted(set(NODE_ID.findall(DOC.read_text())))


def resolve(node_id: str) -> object:
    """The test object a node id names; parametrized ids must name a real parameter."""
    path, *parts = node_id.split("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    target: object = module
    for part in parts:
        name, _, param = part.partition("[")
        target = getattr(target, name)
        if param:
            marks = getattr(target, "pytestmark", [])
            values = [
                str(v)
                for m in marks
                if m.name == "parametrize"
                for v in (m.args[1] if len(m.args) > 1 else [])
            ]
            assert param.rstrip("]") in values, f"{node_id}: no parameter {param.rstrip(']')}"
    return target


def test_the_document_names_tests():
    assert len(node_ids()) > 40


@pytest.mark.parametrize("node_id", node_ids())
def test_every_named_test_exists(node_id):
    assert callable(resolve(node_id)), node_id


def test_every_failure_matrix_case_has_a_row():
    rows = re.findall(r"^\| ([A-L]) \|", DOC.read_text(), flags=re.MULTILINE)
    assert rows == list("ABCDEFGHIJKL")


def test_the_checker_can_fail():
    with pytest.raises(AttributeError):
        resolve("tests/unit/test_engine.py::test_that_does_not_exist")
    with pytest.raises(AssertionError):
        resolve(
            "tests/e2e/test_crash_cases.py::test_cases_e_f_process_killed_mid_batch_loses_nothing[x]"
        )


def test_every_sink_has_a_row_in_the_delivery_tiers_table():
    """A sink the package offers cannot ship without its stated guarantee and its proof."""
    from azure_functions_db.sinks import bindings, delta, memory, queue, sql

    section = DOC.read_text().split("## Sinks (delivery tiers)", 1)[1].split("\n## ", 1)[0]
    rows = {
        row.split("|")[1].strip().split()[0].strip("`"): row
        for row in section.splitlines()
        if row.startswith("| `") or row.startswith("| The handler")
    }
    sinks = [
        name
        for module in (sql, memory, delta, queue, bindings)
        for name, value in vars(module).items()
        if isinstance(value, type)
        and value.__module__ == module.__name__
        and name.endswith(("Sink", "Output"))
    ]
    assert sorted(sinks) == ["DeltaSink", "MemorySink", "QueueSink", "SqlOutput", "SqlSink"]
    for name in sinks:
        assert name in rows, f"{name} has no row in the delivery tiers table"
        assert NODE_ID.search(rows[name]), f"{name}'s row names no test"
