"""Documents for knowledge bases: reading text and markdown files, titling them, cutting them into chunks.

Plain functions with no database access; `models.knowledge` stores what they produce.
"""

from __future__ import annotations

import re
from pathlib import Path

from models.errors import DocumentError

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "MARKDOWN_SUFFIXES",
    "MAX_DOCUMENT_BYTES",
    "MAX_PATH_CHARS",
    "MAX_TITLE_CHARS",
    "chunk_text",
    "document_title",
    "read_document_file",
]

DEFAULT_CHUNK_CHARS = 1200
"""Largest chunk, in characters: whole paragraphs are packed up to this size."""
MAX_TITLE_CHARS = 500
MAX_PATH_CHARS = 2048
MAX_DOCUMENT_BYTES = 10_000_000
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd"})

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+\S")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_H1 = re.compile(r"^ {0,3}#\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def chunk_text(text: str, max_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """Cut a document into chunks of whole paragraphs, each at most `max_chars` characters.

    Paragraphs (separated by blank lines) are packed together while they fit; a markdown heading
    starts a new chunk so a section's text stays with its heading; a paragraph longer than
    `max_chars` is cut at sentence ends, then between words, then anywhere.
    """
    if max_chars < 20:
        raise ValueError("max_chars must be at least 20")
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    pieces: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(normalized):
        stripped = paragraph.strip()
        if stripped:
            pieces.extend(_split_long(stripped, max_chars))
    chunks: list[str] = []
    current = ""
    only_headings = False
    for piece in pieces:
        heading = _HEADING.match(piece) is not None
        if current and heading and not only_headings:
            chunks.append(current)
            current = ""
        if not current:
            current, only_headings = piece, heading
        elif len(current) + 2 + len(piece) <= max_chars:
            current = f"{current}\n\n{piece}"
            only_headings = only_headings and heading
        else:
            chunks.append(current)
            current, only_headings = piece, heading
    if current:
        chunks.append(current)
    return chunks


def _split_long(paragraph: str, max_chars: int) -> list[str]:
    if len(paragraph) <= max_chars:
        return [paragraph]
    parts: list[str] = []
    for sentence in _SENTENCE_END.split(paragraph):
        if len(sentence) <= max_chars:
            parts.append(sentence)
            continue
        for word in sentence.split():
            parts.extend(word[i : i + max_chars] for i in range(0, len(word), max_chars))
    out: list[str] = []
    current = ""
    for part in parts:
        if not current:
            current = part
        elif len(current) + 1 + len(part) <= max_chars:
            current = f"{current} {part}"
        else:
            out.append(current)
            current = part
    if current:
        out.append(current)
    return out


def document_title(path: Path, content: str) -> str:
    """A markdown file's first `# Heading`, otherwise the file name without its extension."""
    if path.suffix.lower() in MARKDOWN_SUFFIXES:
        match = _H1.search(content)
        if match:
            return " ".join(match["title"].split())[:MAX_TITLE_CHARS]
    return (path.stem or path.name)[:MAX_TITLE_CHARS]


def read_document_file(path: str | Path) -> tuple[Path, str, str]:
    """(absolute path, title, content) of a text or markdown file; DocumentError says what is wrong."""
    given = str(path)
    file = Path(path).expanduser()
    if not file.exists():
        raise DocumentError(f"file not found: {given}")
    if not file.is_file():
        raise DocumentError(f"not a file: {given}")
    resolved = file.resolve()
    if len(str(resolved)) > MAX_PATH_CHARS:
        raise DocumentError(f"file path is longer than {MAX_PATH_CHARS} characters: {given}")
    try:
        size = resolved.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DocumentError(f"file is larger than {MAX_DOCUMENT_BYTES} bytes: {given}")
        data = resolved.read_bytes()
    except OSError as exc:
        raise DocumentError(f"cannot read {given}: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise DocumentError(f"not a text file: {given} (only UTF-8 text and markdown can be added)")
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(f"not UTF-8 text: {given} (only UTF-8 text and markdown can be added)") from None
    return resolved, document_title(resolved, content), content
