"""Nothing in the repository points outside it: a clone has every document and file it refers to.

The contract is docs/contract.md. No file may cite a `SPEC.md`, a "seed" document, a sibling
folder (`shared/` beside the checkout), a path above the checkout (`ROOT.parent`, `parents[N]` past the root),
or a Markdown link that leaves the repository or leads nowhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".local", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules", "__pycache__"}

OUTSIDE_DOCUMENTS = re.compile(
    r"""
      SPEC\.md                                   # the old out-of-repo contract
    | \.\./shared\b | \.parent\s*/\s*["']shared["']   # the folder beside the checkout
    | \bROOT\.parent\b                           # above the checkout
    | \b[Tt]he\s+seed\b | \b[Ss]eed\s+["“] | \([Ss]eed\) | \([Ss]eed:\s+(?!int\b)[a-z]{3,}\s
    | \b[Ss]eed's\b | \b[Ss]eed\s+documents?\b   # a "seed" document, by any of the ways it was cited
    """,
    re.VERBOSE,
)
_PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")
_MD_LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def repository_files() -> list[Path]:
    """Tracked and new (not ignored) files; without git, every file outside tool and cache folders."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file() and not SKIP_DIRS & set(path.relative_to(ROOT).parts) and ".egg-info" not in str(path)
    ]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary


def _texts() -> dict[Path, str]:
    this = Path(__file__).resolve()
    return {path: text for path in repository_files() if path != this and (text := _text(path)) is not None}


def test_the_patterns_catch_what_was_cited_before() -> None:
    cited = [
        # Spelled in pieces, so this file itself names no path outside the repository.
        "The product contract is [SPEC.md](" + ".." + "/shared/SPEC.md) in the shared folder",
        "SPEC_PATH = ROOT.parent / " + '"shared"' + ' / "SPEC.md"',
        '"""The framework-agnostic agent contract (seed "Agent Handlers").',
        "# Built once per invocation and handed to the nodes through the config (seed).",
        '"""What the handler builds once per invocation (seed: never rebuilt per loop).',
        "The model reads the error and can correct itself, as the seed's tool contract asks",
        "## Handlers (from the seed documents)",
    ]
    assert [line for line in cited if not OUTSIDE_DOCUMENTS.search(line)] == []
    legitimate = [
        "def _content(seed: int, words: int = 550) -> str:",
        "return WORDS[(seed + i * 7) % len(WORDS)]",
        "SEED = 4242",
        "rng = random.Random(SEED)",
        "the benchmarks' seeded sessions",
    ]
    assert [line for line in legitimate if OUTSIDE_DOCUMENTS.search(line)] == []


def test_no_file_cites_a_document_or_folder_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path, text in _texts().items()
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE_DOCUMENTS.search(line)
    ]
    assert found == [], "name the behaviour, or point to docs/contract.md:\n" + "\n".join(found)


def test_no_file_climbs_above_the_checkout() -> None:
    """`Path(__file__).resolve().parents[N]` stays inside the repository (N < the file's depth)."""
    found = [
        f"{path.relative_to(ROOT)}: parents[{m[1]}]"
        for path, text in _texts().items()
        if path.suffix == ".py"
        for m in _PARENTS.finditer(text)
        if int(m[1]) >= len(path.relative_to(ROOT).parts)
    ]
    assert found == []


@pytest.mark.parametrize(
    "name", ["README.md", "BENCHMARKS.md", "docs/contract.md", "docs/gateway.md", "docs/handlers.md"]
)
def test_markdown_links_stay_inside_and_lead_somewhere(name: str) -> None:
    path = ROOT / name
    bad = []
    for match in _MD_LINK.finditer(path.read_text(encoding="utf-8")):
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(target)
    assert bad == [], f"{name} links outside the repository or to nothing: {bad}"


def test_every_markdown_file_is_checked() -> None:
    checked = {"README.md", "BENCHMARKS.md", "docs/contract.md", "docs/gateway.md", "docs/handlers.md"}
    present = {str(path.relative_to(ROOT)) for path in repository_files() if path.suffix == ".md"}
    assert present <= checked, f"add these to the link check: {sorted(present - checked)}"
