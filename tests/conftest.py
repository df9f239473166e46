"""Shared fixtures and the CI guard: in CI (``CI=true``) a skipped test fails the session."""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI", "").lower() == "true" and _skipped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"CI=true: {len(_skipped)} test(s) were skipped; in CI every service tier must "
                "run. Skipped: " + ", ".join(_skipped[:20]),
                red=True,
                bold=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
