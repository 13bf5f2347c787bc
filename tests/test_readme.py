"""The README is short, its links lead somewhere, and its commands run as written.

Every ```sh / ```bash block of README.md is either run against ``rtserve serve`` over the shipped models it needs
(exported from ``weights/`` into a temporary repository, as ``make serve`` does) or marked, on the line just above
its fence, ``<!-- not-run: <why> -->`` (it trains a model, starts a server, needs Docker or a GPU ...). A block is
run with bash from the repository root, with ``rtserve`` on the PATH and ``localhost:8000`` pointing at the test's
service; it must exit 0. Where a ```json block follows it, that is the output the README shows: the block's output
must be JSON with every key shown there (values may differ: probabilities, forecasts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250
SHELL = {"sh", "bash", "shell", "console"}
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<why>.*?)\s*-->")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
# the shipped model that answers each task when a README block asks for that task (the task's default in weights/)
TASK_MODELS = {"classify": "rmt-hyperpartisan", "summarize": "srformer-news", "forecast": "rsa-etth1-h24"}


@dataclass
class Block:
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    not_run: str | None  # the reason, where the block is marked
    end: int  # of the closing fence, 1-based
    output: str | None = None  # the ```json block right after it, if any


def blocks_of(markdown: str) -> list[Block]:
    """The fenced blocks in order, each with the not-run mark on the line above it and the json block after it."""
    lines, blocks, i = markdown.splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})\s*(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
        assert end is not None, f"README.md:{i + 1}: a fence that is never closed"
        mark = NOT_RUN.search(lines[i - 1]) if i else None
        blocks.append(Block(fence.group(2).lower(), "\n".join(lines[i + 1 : end]), i + 1,
                            mark.group("why") if mark else None, end + 1))
        i = end + 1
    for before, after in zip(blocks, blocks[1:], strict=False):
        gap = lines[before.end : after.line - 1]
        if before.language in SHELL and after.language == "json" and not any(line.strip() for line in gap):
            before.output = after.text
    return blocks


def unfenced(markdown: str) -> str:
    """The text outside fenced blocks, where headings are (a ``# comment`` in a shell block is none)."""
    return re.sub(r"^(`{3,}).*?^\1\s*$", "", markdown, flags=re.S | re.M)


def prose(markdown: str) -> str:
    """The text outside fenced blocks and inline code, where links are."""
    return re.sub(r"`[^`\n]*`", "", unfenced(markdown))


def headings(markdown: str, level: str = "#{1,6}") -> list[str]:
    return re.findall(rf"^{level}\s+(.+?)\s*#*\s*$", unfenced(markdown), flags=re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    found, counts = set(), {}
    for heading in headings(path.read_text()):
        base = slug(heading)
        found.add(f"{base}-{counts[base]}" if base in counts else base)
        counts[base] = counts.get(base, 0) + 1
    return found


def section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", markdown, flags=re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


TEXT = README.read_text()
BLOCKS = blocks_of(TEXT)
RUN = [b for b in BLOCKS if b.language in SHELL and b.not_run is None]


def test_readme_fits_in_250_lines():
    lines = TEXT.count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"


def test_table_of_contents_lists_every_section_and_its_links_resolve():
    contents = section(TEXT, "Contents")
    targets = [m.group("target") for m in LINK.finditer(contents)]
    sections = {slug(h) for h in headings(TEXT, "##")} - {"contents"}
    assert all(t.startswith("#") for t in targets), targets
    missing = [t for t in targets if t[1:] not in sections]
    assert not missing, f"contents links to no heading: {missing}"
    left_out = sections - {t[1:] for t in targets}
    assert not left_out, f"sections missing from the contents: {left_out}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for match in LINK.finditer(prose(page.read_text())):
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading in {file.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_every_docs_page_is_in_the_readme_index():
    index = {m.group("target") for m in LINK.finditer(section(TEXT, "Docs"))}
    missing = [p.name for p in DOCS if f"docs/{p.name}" not in index]
    assert not missing, f"docs pages missing from the README's Docs list: {missing}"


def test_every_setting_is_in_the_settings_page():
    page = (ROOT / "docs" / "settings.md").read_text()
    missing = [name for name in Settings.model_fields if f"`RTSERVE_{name.upper()}`" not in page]
    assert not missing, f"settings missing from docs/settings.md: {missing}"


def test_every_shell_block_is_run_or_says_why_not():
    marks = [i + 1 for i, line in enumerate(TEXT.splitlines()) if NOT_RUN.search(line)]
    marked = {b.line - 1 for b in BLOCKS if b.not_run is not None}
    assert set(marks) == marked, f"README.md: not-run marks not on the line above a fence: {set(marks) - marked}"
    unexplained = [b.line for b in BLOCKS if b.not_run is not None and not b.not_run]
    assert not unexplained, f"README.md: not-run marks without a reason, blocks at lines {unexplained}"
    unlabelled = [b.line for b in BLOCKS if not b.language]
    assert not unlabelled, f"README.md: fences without a language (sh, json, ...) at lines {unlabelled}"
    assert RUN, "no README block is run"
    for block in BLOCKS:
        if block.output is not None:
            json.loads(block.output)  # what the README shows as output is JSON


def has_keys(shown: object, actual: object, where: str = "answer") -> list[str]:
    """Where ``shown`` (the README's output) has a key or a nested shape that ``actual`` lacks."""
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [f"{where} is not an object"]
        return [problem for key, value in shown.items()
                for problem in ([f"{where} has no '{key}'"] if key not in actual
                                else has_keys(value, actual[key], f"{where}.{key}"))]
    if isinstance(shown, list):
        if not isinstance(actual, list):
            return [f"{where} is not a list"]
        return has_keys(shown[0], actual[0], f"{where}[0]") if shown and actual else []
    return []


@pytest.fixture(scope="module")
def service(tmp_path_factory, redis_url, key_prefix):
    """``rtserve serve`` on the shipped models the run blocks ask for, exported as ``make serve`` exports them."""
    from loadtest.chaos import free_port
    from tests.service_helpers import start_rtserve

    text = "\n".join(b.text for b in RUN)
    names = {model for task, model in TASK_MODELS.items() if re.search(rf"\b{task}\b", text)}
    names |= {p.name for p in (ROOT / "weights").iterdir() if p.is_dir() and p.name in text}
    folder = tmp_path_factory.mktemp("readme")
    repository, tools = folder / "model_repository", folder / "bin"
    exported = subprocess.run(
        [sys.executable, "-m", "rtserve", "export", *(str(ROOT / "weights" / n) for n in sorted(names)),
         "--format", "onnx", "--cpu-threads", "1", "--out", str(repository)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    tools.mkdir()
    (tools / "rtserve").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rtserve "$@"\n')
    (tools / "rtserve").chmod(0o755)
    port = free_port()
    settings = {"RTSERVE_MODEL_REPOSITORY": str(repository), "RTSERVE_REDIS_URL": redis_url,
                "RTSERVE_REDIS_KEY_PREFIX": f"{key_prefix}-readme"}
    process = start_rtserve(settings, port, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")} | {
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "RTSERVE_URL": f"http://127.0.0.1:{port}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        yield port, env
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[f"line-{b.line}" for b in RUN])
def test_readme_command_block_runs(block, service):
    port, env = service
    script = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{port}", block.text)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"README.md:{block.line} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"README.md:{block.line} printed nothing"
    if block.output is not None:
        problems = has_keys(json.loads(block.output), json.loads(done.stdout))
        assert not problems, f"README.md:{block.line}: the output shown does not match the answer: {problems}"
