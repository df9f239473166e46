"""`make test` bootstraps what it needs on a fresh Debian machine: the Debian packages too.

``make test`` depends on ``make debian-packages`` (tools/debian-packages.sh): as root it
installs the missing packages (``apt-get update`` first); otherwise it stops with one line naming
them and the command. ``.ci/run`` calls only the README's commands.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "debian-packages.sh"


def makefile_packages() -> list[str]:
    (line,) = re.findall(r"^DEBIAN_PACKAGES := (.+)$", (REPO / "Makefile").read_text(), re.M)
    return line.split()


def test_make_test_depends_on_the_debian_packages_and_ci_calls_only_the_readme():
    makefile = (REPO / "Makefile").read_text()
    (prerequisites,) = re.findall(r"^test: (.*?) ##", makefile, re.M)
    assert "debian-packages" in prerequisites.split()
    ci = (REPO / ".ci" / "run").read_text()
    assert "apt-get" not in ci
    commands = re.findall(r"^make (\w+)", ci, re.M)
    assert commands == ["lint", "test", "soak", "demo"]
    readme = (REPO / "README.md").read_text()
    for command in commands:  # CI calls only what the README tells users to run
        assert f"make {command}" in readme, command
    # the soak bootstraps what it needs, like `make test`
    (soak,) = re.findall(r"^soak: (.*?) ##", makefile, re.M)
    assert {"debian-packages", "$(STAMP)", "$(AZURITE_STAMP)"} <= set(soak.split())


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not applicable: not Debian")
def test_every_package_the_makefile_names_is_installed_after_make_test():
    for package in makefile_packages():
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        assert status == "install ok installed", package


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="not applicable: needs setpriv")
def test_without_root_a_missing_package_is_one_line_naming_it_and_the_command():
    # `nobody` runs a copy in a folder it may read: the clone may live where other users
    # cannot (a home directory, `mktemp -d`, pytest's own mode-700 temporary folders).
    readable = Path(tempfile.mkdtemp(prefix="afdb-bootstrap-"))
    try:
        readable.chmod(0o755)
        script = readable / SCRIPT.name
        shutil.copyfile(SCRIPT, script)
        script.chmod(0o644)
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "bash", str(script), "faketime", "afdb-no-such-package"],
            capture_output=True, text=True, timeout=60, check=False, cwd=readable,
        )  # fmt: skip
    finally:
        shutil.rmtree(readable)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "afdb-no-such-package" in line
    assert "faketime" not in line.split(":")[1].split(";")[0]  # installed ones are not named
    assert "sudo apt-get update && sudo apt-get install -y -qq afdb-no-such-package" in line
