"""docs/configuration.md documents every `afdb` command and option that the parser defines.

The commands and options are read from the real parser (`cli.build_parser`), so a new command or
option fails this test until the "Command line" section mentions it. Options of `afdb` itself
(`-v`, `--verbose`, which every command accepts too) belong to the section's introduction; any
other option belongs to the `### afdb <command>` section of its command, in backticks (`--once`,
`--poller NAME`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from azure_functions_db.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HELP = {"-h", "--help"}
INTRO = ""  # the section key of the introduction (the options of `afdb` itself)


def options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of one parser, without -h/--help."""
    return {s for action in parser._actions for s in action.option_strings} - HELP


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def expected() -> list[tuple[str, str]]:
    """(section, option) pairs the doc must hold; option "" stands for the section itself."""
    parser = build_parser()
    every = [options(sub) for sub in commands(parser).values()]
    # Options of `afdb` itself, and those every command takes: documented once, up front.
    shared = options(parser) | set.intersection(*every)
    pairs = {(INTRO, option) for option in shared}
    for name, sub in commands(parser).items():
        pairs.add((name, ""))
        pairs.update((name, option) for option in options(sub) - shared)
    return sorted(pairs)


def sections(doc: str) -> dict[str, str]:
    """The "Command line" section: its introduction, and the text of each `### afdb <name>`."""
    match = re.search(r"^## Command line\n(.*?)(?=^## |\Z)", doc, flags=re.MULTILINE | re.DOTALL)
    assert match, 'docs/configuration.md has no "## Command line" section'
    intro, *rest = re.split(r"^### afdb (\S+)\n", match.group(1), flags=re.MULTILINE)
    return {INTRO: intro, **dict(zip(rest[::2], rest[1::2], strict=True))}


def gap(doc: str, section: str, option: str) -> str | None:
    """What the doc lacks for one (section, option) pair, or None."""
    found = sections(doc)
    if section not in found:
        return f"no section `### afdb {section}`"
    if option and not re.search(rf"`{re.escape(option)}[`\s=]", found[section]):
        where = "the introduction" if section == INTRO else f"`### afdb {section}`"
        return f"`{option}` is not mentioned (in backticks) in {where}"
    return None


def missing(doc: str) -> list[str]:
    gaps = (gap(doc, section, option) for section, option in expected())
    return list(dict.fromkeys(g for g in gaps if g))


def test_the_parser_is_walked():
    pairs = set(expected())
    assert {name for name, option in pairs if not option} >= {
        "demo",
        "run",
        "status",
        "seek",
        "validate",
        "backfill",
    }
    assert {("run", "--once"), ("seek", "--beginning"), ("backfill", "--run-id")} <= pairs
    assert {(INTRO, "-v"), (INTRO, "--verbose")} <= pairs
    assert not any(option in HELP for _, option in pairs)


@pytest.mark.parametrize(
    ("section", "option"),
    expected(),
    ids=[" ".join(filter(None, ("afdb", s, o))) for s, o in expected()],
)
def test_every_command_and_option_is_documented(section, option):
    assert gap(DOC.read_text(), section, option) is None


def test_the_checker_can_fail():
    doc = DOC.read_text()
    assert missing(doc) == []
    without_option = re.sub(r"`--run-id[^`]*`", "`…`", doc)
    assert missing(without_option) == [
        "`--run-id` is not mentioned (in backticks) in `### afdb backfill`"
    ]
    without_command = doc.replace("### afdb seek\n", "### Seek\n")
    assert "no section `### afdb seek`" in missing(without_command)


def test_the_version_is_printed(capsys):
    with pytest.raises(SystemExit) as leaving:
        build_parser().parse_args(["--version"])
    assert leaving.value.code == 0
    assert re.fullmatch(r"afdb \d+\.\d+\.\d+.*\n", capsys.readouterr().out)
