"""The spread over several runs: `python -m bench.report RUN1.json RUN2.json ...` prints a Markdown table.

Each file is what `python -m bench --json FILE` wrote. Per figure: the median figure and baseline,
the ratio's median and its range (min..max) over the runs, and how many runs met the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def spread_table(runs: list[list[dict[str, Any]]]) -> str:
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    order: list[str] = []
    for rows in runs:
        for row in rows:
            if row["name"] not in by_name:
                order.append(row["name"])
            by_name[row["name"]].append(row)
    lines = [
        "| figure | median | baseline (median) | ratio median | ratio range | limit | runs meeting |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in order:
        rows = [r for r in by_name[name] if "figure" in r]
        failed = len(by_name[name]) - len(rows)
        if not rows:
            lines.append(f"| {name} | - | - | - | - | - | {failed} run(s) errored |")
            continue
        unit = rows[0]["unit"]
        ratios = [r["ratio"] for r in rows]
        limit = rows[0]["limit"]
        met = sum(1 for r in rows if r["verdict"] == "meets")
        verdict = f"{met}/{len(rows)}" if limit is not None else "info"
        if failed:
            verdict += f" ({failed} errored)"
        lines.append(
            f"| {name} | {statistics.median(r['figure'] for r in rows):.4g} {unit} "
            f"| {statistics.median(r['baseline'] for r in rows):.4g} {unit} "
            f"| {statistics.median(ratios):.2f}x | {min(ratios):.2f}x .. {max(ratios):.2f}x "
            f"| {f'{limit:.2f}x' if limit is not None else '-'} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    print(spread_table([json.loads(Path(f).read_text()) for f in args.files]))


if __name__ == "__main__":
    main()
