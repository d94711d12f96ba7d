"""The user guide's printed outputs still hold: every command in docs/*.md whose output the page shows runs, and
each line shown is printed again (tests/test_docs.py does the same for the README's tutorial).

A page marks what to run with an HTML comment on the line above a fenced block (the site renders none):

- ``<!-- test: file NAME -->``: the block is a file the reader saves as NAME (in the folder the commands run in);
- ``<!-- test: run -->``: a block of commands; the next fenced block is what they print. A block whose lines
  start with ``$ `` is a terminal: each ``$ `` line (joined with the lines after it while it ends in ``\\``) is
  a command, the other lines its output;
- ``<!-- test: run COMMAND -->``: the block is what COMMAND (given in the prose) prints.

Commands run in order, per page, in a fresh folder whose ``.venv`` is this interpreter's environment (``hcsim``
and ``.venv/bin/hcsim`` both work). Each shown line must be a whole line of what was printed, any run of spaces
standing for any other; a line ``...`` leaves lines out, ``...`` inside a line stands for any text, and a
printed line the page wraps runs on over the page's next lines. The wall time, its rate and the peak memory of the ``simulated ...``
line depend on the machine and are not compared (the activity count is). A command whose shown output has an
``hcsim: error:`` must exit with status 2, any other with 0.

Documented commands not run here, and why (none of them has its output printed line by line):

- docs/performance.md, the vTrain-size GPT-3 175B row on 512 A100: 30-45 s and 2.4 GB, and what the page
  gives of it are wall times and memory, which depend on the machine;
- docs/validation.md, ``hcsim validate`` of Korthikanti's Table 5: about 2 minutes with ``--jobs 2`` (512-A100
  rows), and it writes the committed results; its figures are in ``experiments/validation/results``, which
  tests/study/test_validate.py reads;
- docs/validation.md, ``benchmarks/gpu_kernels.py`` and ``hcsim calibrate`` of its CSV: need PyTorch and a GPU;
- docs/platforms.md, docs/running.md, docs/workloads.md: their other command lists and runs, whose output the page
  describes in prose, not prints (the blocks those pages print are marked and run); the ``draw``, ``export`` and
  ``import`` commands write files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = re.compile(r"^\s*<!-- test: (file (\S+)|run(?: (.+?))?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
# the machine's part of the summary's last line: wall time, activities per second, peak memory
MACHINE = re.compile(r"in [\d.]+ s wall \([\d,]+/s\), peak [\d.]+ [kMG]i?B")


def fenced_blocks(text: str) -> list[tuple[re.Match | None, str]]:
    """(the marker above it or None, body with its indentation removed) of each fenced block, in order."""
    lines = text.splitlines()
    blocks, marker, i = [], None, 0
    while i < len(lines):
        if MARKER.match(lines[i]):
            marker = MARKER.match(lines[i])
        elif FENCE.match(lines[i]):
            indent = len(FENCE.match(lines[i]).group(1))
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            body = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
            blocks.append((marker, body))
            marker, i = None, end
        elif lines[i].strip():
            marker = None  # a marker belongs to the block right below it
        i += 1
    return blocks


def joined(lines: list[str]) -> list[str]:
    """Shell lines with their continuations (a line ending in a backslash) joined."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + line.strip()
        else:
            out.append(line.strip())
    return [line for line in out if line]


def steps(page: Path) -> list[dict]:
    """The page's marked steps in order: {kind: file, name, body} or {kind: run, commands, shown}."""
    blocks, found = fenced_blocks(page.read_text(encoding="utf-8")), []
    i = 0
    while i < len(blocks):
        marker, body = blocks[i]
        i += 1
        if marker is None:
            continue
        if marker.group(2):
            found.append({"kind": "file", "name": marker.group(2), "body": body})
        elif marker.group(3):
            found.append({"kind": "run", "commands": [marker.group(3).strip()], "shown": body.splitlines()})
        elif any(line.startswith("$ ") for line in body.splitlines()):
            lines = body.splitlines()
            commands, shown, k = [], [], 0
            while k < len(lines):
                if lines[k].startswith("$ "):
                    command = [lines[k][2:]]
                    while command[-1].endswith("\\") and k + 1 < len(lines):
                        k += 1
                        command.append(lines[k])
                    commands += joined(command)
                else:
                    shown.append(lines[k])
                k += 1
            found.append({"kind": "run", "commands": commands, "shown": shown})
        else:
            assert i < len(blocks) and blocks[i][0] is None, (f"{page.name}: <!-- test: run --> above {body[:60]!r} "
                                                              "needs the block of its output right after it")
            found.append({"kind": "run", "commands": [c for c in joined(body.splitlines())],
                          "shown": blocks[i][1].splitlines()})
            i += 1
    return found


def pattern(line: str) -> re.Pattern:
    """A shown line as a pattern over the printed text: a whole printed line (or lines, when the page wraps one),
    any run of spaces for one, ``...`` for any text, the machine's figures for any."""
    words = MACHINE.sub(" \0 ", line).split()
    return re.compile(r"^[ \t]*" + r"\s+".join(
        MACHINE.pattern if word == "\0" else "[^\n]*?".join(re.escape(bit) for bit in word.split("..."))
        for word in words) + r"[ \t]*$", re.MULTILINE)


def missing(shown: list[str], printed: str) -> list[str]:
    """The shown lines not printed; a shown line that is not may be one the page wraps: it and the lines after it,
    joined, must then be a printed line."""
    lines = [line for line in shown if line.strip() and line.strip() != "..."]
    gone, k = [], 0
    while k < len(lines):
        for end in range(k + 1, len(lines) + 1):
            if pattern(" ".join(lines[k:end])).search(printed):
                k = end
                break
            if end - k >= 8:
                gone.append(lines[k])
                k += 1
                break
        else:
            gone.append(lines[k])
            k += 1
    return gone


PAGES = sorted(p for p in DOCS.glob("*.md") if any(s["kind"] == "run" for s in steps(p)))


def test_the_pages_mark_the_outputs_they_print():
    """The pages that print a command's output mark it (a page losing its markers would leave it unchecked)."""
    names = {p.name for p in PAGES}
    assert {"parallelism.md", "stragglers.md", "platforms.md"} <= names, names
    runs = [s for p in PAGES for s in steps(p) if s["kind"] == "run"]
    assert len(runs) >= 7 and all(s["commands"] and any(line.strip() for line in s["shown"]) for s in runs)


def test_the_parser_reads_files_runs_terminals_and_wrapped_lines():
    text = ("<!-- test: file a.yaml -->\n```yaml\nk: 1\n```\n<!-- test: run -->\n```sh\nhcsim x \\\n  --y\n```\n\n"
            "```text\nout\n```\n  <!-- test: run -->\n  ```\n  $ hcsim z \\\n      --w\n  said\n  ```\n"
            "<!-- test: run hcsim v -->\n```\nline\n```\n```\nunmarked\n```\n")
    page = Path(__file__).parent / "_parser_page.md"
    try:
        page.write_text(text)
        assert steps(page) == [
            {"kind": "file", "name": "a.yaml", "body": "k: 1\n"},
            {"kind": "run", "commands": ["hcsim x  --y"], "shown": ["out"]},
            {"kind": "run", "commands": ["hcsim z  --w"], "shown": ["said"]},
            {"kind": "run", "commands": ["hcsim v"], "shown": ["line"]}]
    finally:
        page.unlink()
    printed = "  iteration time   2.6 s  (iterations: 2.6 s)\nhcsim: error: a b c d\n  simulated 5 activities " \
              "on the C++ core in 0.76 s wall (693,581/s), peak 59 MB\n"
    assert missing(["  iteration time   2.6 s  (iterations: 2.6 s)", "..."], printed) == []
    assert missing(["  iteration time   2.6 s  (iterations: 2.65 s)"], printed) != []  # whole numbers only
    assert missing(["  iteration time 2.6"], printed) != []  # a whole line
    assert missing(["iteration time   2.6 s  (iterations: 2.6 s)"], "x " + printed) != []
    assert missing(["hcsim: error: a", "b c d"], printed) == []  # wrapped by the page
    assert missing(["iteration time ... (iterations: ...)"], printed) == []
    assert missing(["simulated 5 activities on the C++ core in 2.72 s wall (194,554/s), peak 60 MB"], printed) == []
    assert missing(["simulated 6 activities on the C++ core in 2.72 s wall (194,554/s), peak 60 MB"], printed) != []


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_printed_output_in_the_user_guide_is_printed_again(page, tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "hcsim").exists():
        pytest.skip(f"the pages call hcsim from .venv/bin; {venv} has no bin/hcsim (tests run outside a venv)")
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCSIM_", "VIRTUAL_ENV"))}
    env.update(COLUMNS="200", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    problems = []
    for step in steps(page):
        if step["kind"] == "file":
            (tmp_path / step["name"]).write_text(step["body"], encoding="utf-8")
            continue
        error = any("hcsim: error:" in line for line in step["shown"])
        printed = ""
        for command in step["commands"]:
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            expected = 2 if error else 0
            assert done.returncode == expected, (f"{page.name}: {command}\nexit {done.returncode}, expected "
                                                 f"{expected}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            printed += done.stdout + "\n" + done.stderr + "\n"
        gone = missing(step["shown"], printed)
        if gone:
            problems.append(f"{page.name}: {' ; '.join(step['commands'])}\n  no longer prints these lines the page shows (update them from the output below):\n"
                            + "\n".join("    " + line for line in gone) + "\n  --- printed:\n" + printed)
    assert not problems, "\n\n".join(problems)
