"""The documentation: the user's guide builds in strict mode, and the README's tutorial runs as written.

The tutorial lies between ``<!-- --8<-- [start:tutorial] -->`` and ``[end:tutorial]`` in README.md (the site's
tutorial page includes the same lines). Every fenced block in it carries a marker on the line above:

- ``<!-- test: file NAME -->``: the block is a file the reader saves as NAME;
- ``<!-- test: run -->``: a ``sh`` block of commands, run in order from a fresh folder that stands for the
  clone (its ``.venv`` is this interpreter's environment); the ``text`` block right after it is their output
  as printed, and every line of it must be printed again (wall-time lines aside, as they depend on the
  machine). A command whose shown output is an ``hcsim: error:`` line must exit with status 2, any other 0.

Every command of the tutorial takes seconds, so all of them run (no dry runs needed).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- --8<-- [start:tutorial] -->", "<!-- --8<-- [end:tutorial] -->"
MARKER = re.compile(r"^<!-- test: (run|file (\S+)) -->$")
FENCE = re.compile(r"^```(\w*)$")
MACHINE_DEPENDENT = re.compile(r" activities (on the [^ ]+ [^ ]+ )?in [\d.]+ s wall ")  # wall time and peak memory of the run


def tutorial_steps(text: str) -> list[dict]:
    """The tutorial's fenced blocks in order: {kind: run | file | output, name, body}."""
    lines = text.split(START, 1)[1].split(END, 1)[0].splitlines()
    steps, marker, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if MARKER.match(line):
            marker = MARKER.match(line)
        elif FENCE.match(line):
            lang = FENCE.match(line).group(1)
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
            body = "\n".join(lines[i + 1:end]) + "\n"
            if marker is None:
                kind = "output" if lang == "text" else None
                assert kind, f"README tutorial: a ```{lang} block without a <!-- test: ... --> marker: {body[:80]!r}"
                steps.append({"kind": "output", "body": body})
            elif marker.group(1) == "run":
                assert lang == "sh", f"README tutorial: <!-- test: run --> must precede a ```sh block, not ```{lang}"
                steps.append({"kind": "run", "body": body})
            else:
                steps.append({"kind": "file", "name": marker.group(2), "body": body})
            marker, i = None, end
        i += 1
    return steps


def commands(block: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, blank lines dropped."""
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_readme_stays_short_and_links_to_pages_that_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) < 13_500, "the README is a front page: the guide goes to docs/"
    assert "make demo    # set up, then simulate the built-in default and print a summary" in text
    assert "make test    # set up, then run the test suite" in text
    for target in re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_tutorial_block_is_marked_and_every_run_shows_its_output():
    steps = tutorial_steps(README.read_text(encoding="utf-8"))
    runs = [s for s in steps if s["kind"] == "run"]
    assert len(runs) >= 4 and any(s["kind"] == "file" for s in steps)
    for step, after in zip(steps, steps[1:] + [None]):
        if step["kind"] == "run":
            assert after is not None and after["kind"] == "output", f"no output shown after {step['body']!r}"


@pytest.mark.slow
def test_the_readme_tutorial_runs_as_written_and_prints_what_it_shows(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "hcsim").exists():
        pytest.skip(f"the tutorial calls .venv/bin/hcsim; {venv} has no bin/hcsim (tests run outside a venv)")
    clone = tmp_path / "clone"  # stands for the root of a fresh clone after `make demo`
    clone.mkdir()
    (clone / ".venv").symlink_to(venv, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCSIM_", "VIRTUAL_ENV"))}
    env["COLUMNS"] = "200"
    steps = tutorial_steps(README.read_text(encoding="utf-8"))
    for step, after in zip(steps, steps[1:] + [None]):
        if step["kind"] == "file":
            (clone / step["name"]).write_text(step["body"], encoding="utf-8")
        if step["kind"] != "run":
            continue
        shown = after["body"].splitlines()
        printed = []
        if any(line.startswith("hcsim: error:") for line in shown):
            assert len(commands(step["body"])) == 1, "a block that shows an error holds that one command"
        for command in commands(step["body"]):
            done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=300)
            expected = 2 if any(line.startswith("hcsim: error:") for line in shown) else 0
            assert done.returncode == expected, (f"{command}\nexit {done.returncode}, expected {expected}\n"
                                                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            printed += [line.rstrip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
        missing = [line for line in shown if line.strip() and not MACHINE_DEPENDENT.search(line)
                   and line.rstrip() not in printed]
        assert not missing, (f"README tutorial: {step['body'].strip()!r} no longer prints these lines shown in the "
                             f"README (update them from the output below):\n" + "\n".join(missing)
                             + "\n--- printed:\n" + "\n".join(printed))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[test]' installs it (mkdocs-material)")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # from another folder: the site builds from wherever -f is given (the README snippet's base path, the hooks
    # and the API pages' source are found beside mkdocs.yml, not in the current folder)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=tmp_path_factory.mktemp("elsewhere"), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return out


def test_the_user_guide_builds_in_strict_mode(site):
    for page in ("index", "tutorial/index", "concepts/index", "platforms/index", "workloads/index",
                 "parallelism/index", "validation/index", "performance/index", "api/index",
                 "internals/index", "internals/profiling/index"):
        assert (site / f"{page}.html").exists(), page
    assert "llama2-70b-dgx.yaml" in (site / "tutorial" / "index.html").read_text(encoding="utf-8")
    assert "doc-function" in (site / "api" / "index.html").read_text(encoding="utf-8")  # docstrings rendered


def test_the_scenario_key_reference_is_generated_from_the_code(site):
    from hcsim.cli.simulate import scenario_keys_help
    from hcsim.run.scenario import SCENARIO_KEYS

    page = (site / "reference" / "scenario-keys" / "index.html").read_text(encoding="utf-8")
    for key in SCENARIO_KEYS:
        assert f"<code>{key}</code>" in page, f"scenario key {key!r} missing from the reference page"
    first_entry = scenario_keys_help().splitlines()[1].split("(")[0].strip()
    assert first_entry in page
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("hcsim simulate", "hcsim plan", "hcsim sweep", "hcsim validate", "hcsim platform show"):
        assert command in cli


def test_user_pages_name_no_issue_numbers_or_commits():
    internals = {"engine-core.md", "workload-graph.md", "workload-model.md"}  # developer notes
    pages = [p for p in (ROOT / "docs").glob("*.md") if p.name not in internals]
    pages += list((ROOT / "docs" / "reference").glob("*.md"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\b[Ii]ssues? \d+", text), f"{page.name} names an issue number"
        assert not re.search(r"\bcommit [0-9a-f]{7,}", text), f"{page.name} names a commit"
    readme = README.read_text(encoding="utf-8")
    assert not re.search(r"\b[Ii]ssues? \d+|\bcommit [0-9a-f]{7,}", readme)


def test_tutorial_parser_reads_markers_files_and_outputs():
    text = f"x\n{START}\n<!-- test: file a.yaml -->\n```yaml\nk: 1\n```\n<!-- test: run -->\n```sh\nls \\\n  -a\n```\n\n```text\nout\n```\n{END}\n"
    steps = tutorial_steps(text)
    assert [s["kind"] for s in steps] == ["file", "run", "output"]
    assert steps[0] == {"kind": "file", "name": "a.yaml", "body": "k: 1\n"}
    assert commands(steps[1]["body"]) == ["ls    -a"]
