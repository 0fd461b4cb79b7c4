"""A small knowledge-base corpus that tests create for themselves (unique names per test)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from models.knowledge import add_files, create_knowledge_base

REFUNDS = """# Refund policy

Refunds are processed within 14 days of receiving the returned parcel. The money goes back to the
card you paid with.

## Damaged goods

If goods arrive damaged, send a photo within 48 hours and we refund the full price, shipping included.
"""

SHIPPING = """# Shipping times

Standard shipping takes 3 to 5 business days. Express shipping takes one business day and costs
10 euros.

We ship to every country of the European Union.
"""

WARRANTY = """Every appliance comes with a two year warranty.

The warranty covers manufacturing defects. Accidental damage is not covered.
"""

PLANTS = """# Office plants

Water the ficus every Tuesday and keep the orchids away from the radiator.
"""


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """A knowledge base holding the four documents above."""

    name: str
    """The knowledge base's name."""
    documents: dict[str, int]
    """Document id by title: "Refund policy", "Shipping times", "warranty", "Office plants"."""
    files: dict[str, Path]
    """The files, by title."""


def make_corpus(directory: Path, *, name: str | None = None) -> Corpus:
    """Write the corpus files under `directory` and add them to a new knowledge base."""
    kb = name or f"support-{uuid.uuid4().hex[:8]}"
    create_knowledge_base(kb, "customer support answers")
    files = {
        "Refund policy": directory / "refunds.md",
        "Shipping times": directory / "shipping.md",
        "warranty": directory / "warranty.txt",
        "Office plants": directory / "plants.md",
    }
    for path, text in zip(files.values(), (REFUNDS, SHIPPING, WARRANTY, PLANTS), strict=True):
        path.write_text(text, encoding="utf-8")
    added = add_files(kb, list(files.values()))
    return Corpus(name=kb, documents={doc.title: doc.document_id for doc in added}, files=files)
