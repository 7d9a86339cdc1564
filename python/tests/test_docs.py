"""The guide's snippets run (docs/development.md, "The guide's snippets are tested").

Each page of docs/ runs on its own, in a fresh temporary directory: every ```sh block
with `bash -euo pipefail` (the working directory carries over from one block to the
next), every ```python block as its own script in the page's directory at that point.
`quiver` (QUIVER_BIN's folder) and this Python are first on PATH; no service is
configured, so the pages run on embedded defaults. A snippet that breaks fails here.

    QUIVER_BIN=<quiver binary> pytest python/tests/test_docs.py
"""

import glob
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs")
QUIVER = os.environ.get("QUIVER_BIN", os.path.expanduser("~/.cache/quiver/target/debug/quiver"))
PAGES = sorted(glob.glob(os.path.join(DOCS, "*.md")))


def blocks(page):
    """The page's runnable blocks in document order: (kind, first line, text)."""
    lines = open(page, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = line[: len(line) - len(line.lstrip("`"))]
            info, start, body = line[len(fence):].strip(), i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                body.append(lines[i])
                i += 1
            if info in ("sh", "python"):
                found.append((info, start + 1, "\n".join(body) + "\n"))
        i += 1
    return found


def env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    e["PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(QUIVER)), os.path.dirname(sys.executable), e.get("PATH", "")])
    return e


def test_the_guide_has_pages_with_snippets():
    """The run below is not vacuous: the guide's pages are found and most carry snippets."""
    names = {os.path.basename(p) for p in PAGES}
    for page in ("concepts.md", "offline.md", "online.md", "streaming.md", "aggregations.md", "export.md",
                 "consistency.md", "python.md", "commands.md"):
        assert page in names, names
        assert blocks(os.path.join(DOCS, page)), f"docs/{page} has no runnable snippet"
    assert any(kind == "python" for kind, _, _ in blocks(os.path.join(DOCS, "python.md")))


@pytest.mark.parametrize("page", PAGES, ids=os.path.basename)
def test_the_guide_page_runs(page, tmp_path):
    cwd = tmp_path / "run"
    cwd.mkdir()
    where = tmp_path / "cwd"
    for n, (kind, line, text) in enumerate(blocks(page)):
        script = tmp_path / f"{n:03d}.{'sh' if kind == 'sh' else 'py'}"
        script.write_text(text)
        if kind == "sh":
            argv = ["bash", "-euo", "pipefail", "-c", f"trap 'pwd > \"{where}\"' EXIT; source \"{script}\""]
        else:
            argv = [sys.executable, str(script)]
        run = subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)
        if kind == "sh" and where.exists():
            cwd = where.read_text().strip()
        assert run.returncode == 0, (
            f"docs/{os.path.basename(page)}:{line}: the {kind} block failed (exit {run.returncode}):\n{text}\n"
            f"--- output ---\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
        )
