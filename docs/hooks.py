"""MkDocs hook: the reference pages generated from the code at every build, so they cannot go stale.

A page writes a marker on a line of its own, and the hook puts the generated text in its place:

- ``<!-- generated: scenario-keys -->``: the scenario keys, their defaults and meanings, the very text of
  ``hcsim simulate --help`` (``hcsim.cli.simulate.scenario_keys_help``, read from the ``Scenario``
  dataclass), followed by a table of the same entries;
- ``<!-- generated: cli -->``: the ``--help`` of ``hcsim`` and of every subcommand, nested ones included.

mkdocs.yml lists this file under ``hooks:`` and excludes it from the site (``exclude_docs``).
"""

from __future__ import annotations

import argparse
import os
import re

SCENARIO_KEYS = "<!-- generated: scenario-keys -->"
CLI = "<!-- generated: cli -->"
WIDTH = "100"  # argparse wraps help to $COLUMNS


def scenario_keys_markdown() -> str:
    """The scenario keys: the --help text as printed, then one table row per key."""
    from hcsim.cli.simulate import scenario_keys_help

    text = scenario_keys_help()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    entry = re.compile(r"^(\w+) \(default (.*?)\)(?:: (.*))?$")
    for block in re.split(r"\n  (?=\w)", text.split("\n", 1)[1].strip()):
        match = entry.match(" ".join(block.split()))
        if match:
            key, default, meaning = match.groups()
            meaning = (meaning or "").replace("|", "\\|")
            rows.append(f"| `{key}` | `{default}` | {meaning} |")
    return "```text\n" + text + "\n```\n\n" + "\n".join(rows) + "\n"


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def cli_markdown() -> str:
    """Every command's --help, depth first: hcsim, hcsim simulate, hcsim platform, hcsim platform show, ..."""
    from hcsim.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        sections = []

        def walk(parser, name, depth):
            sections.append(f"{'#' * depth} `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
            for sub, child in _subcommands(parser):
                walk(child, f"{name} {sub}", min(depth + 1, 4))

        walk(build_parser(), "hcsim", 2)
        return "\n".join(sections)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def on_page_markdown(markdown: str, page, config, files) -> str:
    if SCENARIO_KEYS in markdown:
        markdown = markdown.replace(SCENARIO_KEYS, scenario_keys_markdown())
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_markdown())
    return markdown
