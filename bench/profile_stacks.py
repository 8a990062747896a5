"""Summarize a ``py-spy record -f raw`` profile: top functions by own and inclusive time.

Usage::

    python -m bench.profile_stacks bench/results/profile_publish_batch100.txt [--top 25]
        [--thread-filter SUBSTRING]

Each line of a raw (collapsed) profile is ``frame;frame;...;frame COUNT``, outermost
first. "Own" time counts samples whose innermost frame is the function; "inclusive"
counts samples with the function anywhere on the stack (once per sample). Percentages
are of all samples in the file (idle samples included unless py-spy ran with --idle off,
its default, which leaves idle threads out).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LOCATION = re.compile(r" \((.*?):\d+\)$")


def _function(frame: str) -> str:
    """``name (file.py:LINE)`` -> ``name (file.py)`` so lines of one function add up."""
    return _LOCATION.sub(lambda m: f" ({m.group(1)})", frame.strip())


def summarize(path: Path, top: int = 25, contains: str | None = None) -> str:
    """The report text for one raw profile file.

    Args:
        path: File written by ``py-spy record -f raw``.
        top: Rows per table.
        contains: Keep only stacks with a frame containing this text.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        if contains is not None and contains not in stack:
            continue
        count = int(count_text)
        total += count
        frames_ = [_function(f) for f in stack.split(";")]
        own[frames_[-1]] += count
        for name in set(frames_):
            inclusive[name] += count
    lines = [f"{path.name}: {total} samples"]
    if total == 0:
        return "\n".join(lines)
    lines.append(f"\nTop {top} by own time:")
    for name, count in own.most_common(top):
        lines.append(f"  {count / total * 100:5.1f}%  {name}")
    lines.append(f"\nTop {top} by inclusive time (futureq, trio, msgpack, rocksdict frames):")
    shown = 0
    for name, count in inclusive.most_common():
        if "runpy" in name or "<module>" in name or "server_main" in name:
            continue
        lines.append(f"  {count / total * 100:5.1f}%  {name}")
        shown += 1
        if shown >= top:
            break
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the summary of each file given."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile_stacks")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread-filter", default=None, help="keep stacks containing this text")
    args = parser.parse_args(argv)
    for path in args.files:
        print(summarize(path, args.top, args.thread_filter))
        print()


if __name__ == "__main__":
    main()
