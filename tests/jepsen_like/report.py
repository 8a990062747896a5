"""Human output of a run: a rich table on the terminal and a self-contained timeline.

``timeline.html`` is one HTML file with an inline SVG (no script, no dependency): the
x axis is seconds since the run started; rows show the faults, each node's state (down,
paused), the observed leader, publish latencies (failed or unknown publishes in red),
delivery lateness, acked-then-redelivered deliveries, and the unavailability windows
shaded across everything.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tests.jepsen_like.checker import MUST_BE_ZERO, WARNINGS
from tests.jepsen_like.history import Event

WIDTH = 1400
LEFT = 130
RIGHT = 20
ROW = 22
PLOT = 160
NODE_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def print_table(summary: dict[str, Any], console: Console | None = None) -> None:
    """Print the verdicts and the main figures of ``summary`` as a table."""
    console = console or Console()
    table = Table(title=f"FutureQ jepsen_like run — seed {summary.get('seed')}")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("verdict")
    for name in MUST_BE_ZERO:
        value = summary.get(name, 0)
        table.add_row(name, str(value), "[green]ok[/]" if value == 0 else "[red]FAIL[/]")
    where = {
        "undelivered": "held by the nodes when the drain ended",
        "buffered": "in a consumer's client buffer when the drain ended",
    }
    for name in WARNINGS:
        value = summary.get(name, 0)
        table.add_row(
            f"{name} ({where.get(name, 'warning')})",
            str(value),
            "[green]ok[/]" if value == 0 else "[yellow]WARN[/]",
        )
    raft = summary.get("raft") or {}
    if "applied_digest_equal" in raft:
        equal = raft["applied_digest_equal"]
        table.add_row(
            "applied digests equal", str(equal), "[green]ok[/]" if equal else "[red]FAIL[/]"
        )
    if "applied_index_equal" in raft:
        table.add_row("applied index equal", str(raft["applied_index_equal"]), "info")
    lateness = summary.get("lateness_ms") or {}
    rows = [
        ("acked_publishes", summary.get("acked_publishes")),
        (
            "unknown / failed publishes",
            f"{summary.get('unknown_publishes')} / {summary.get('failed_publishes')}",
        ),
        ("required (checked for loss)", summary.get("required_publishes")),
        ("deliveries", summary.get("deliveries")),
        (
            "duplicates (ratio)",
            f"{summary.get('duplicates')} ({summary.get('duplicates_ratio', 0):.3f})",
        ),
        (
            "duplicates by cause",
            ", ".join(
                f"{cause} {count}"
                for cause, count in (summary.get("duplicates_by_cause") or {}).items()
                if count
            )
            or "-",
        ),
        ("acked_then_redelivered", summary.get("acked_then_redelivered")),
        ("publish_duplicates", summary.get("publish_duplicates")),
        ("unsettled", summary.get("unsettled")),
        ("lateness p50/p99/max ms", "/".join(_ms(lateness.get(k)) for k in ("p50", "p99", "max"))),
        (
            "leader_changes (after heal)",
            f"{summary.get('leader_changes')} ({summary.get('leader_changes_after_heal', 0)})",
        ),
        (
            "unavailable ms (windows)",
            f"{summary.get('unavailable_ms', 0):.0f} ({len(summary.get('unavailability_windows', []))})",
        ),
        (
            "harness stalls >=250 ms (max, total ms)",
            f"{summary.get('harness_stalls', 0)} ({_ms(summary.get('harness_stall_ms_max'))}, "
            f"{_ms(summary.get('harness_stall_ms_total'))})",
        ),
    ]
    for name, value in rows:
        table.add_row(name, str(value), "info")
    console.print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


class _Svg:
    def __init__(self, t0: float, t1: float) -> None:
        self.t0 = t0
        self.span = max(t1 - t0, 1.0)
        self.parts: list[str] = []
        self.y = 10

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / self.span * (WIDTH - LEFT - RIGHT)

    def add(self, element: str) -> None:
        self.parts.append(element)

    def label(self, text: str, y: float) -> None:
        self.add(f'<text x="4" y="{y + 14:.0f}" font-size="12">{html.escape(text)}</text>')

    def bar(self, t_start: float, t_end: float, y: float, color: str, title: str) -> None:
        x0, x1 = self.x(t_start), self.x(t_end)
        self.add(
            f'<rect x="{x0:.1f}" y="{y + 2:.0f}" width="{max(x1 - x0, 1.5):.1f}" height="{ROW - 4}" '
            f'fill="{color}" opacity="0.8"><title>{html.escape(title)}</title></rect>'
        )


def _intervals(
    events: list[Event], start_kinds: set[str], end_kinds: set[str], end_t: float
) -> dict[int, list[tuple[float, float]]]:
    open_at: dict[int, float] = {}
    found: dict[int, list[tuple[float, float]]] = {}
    for event in events:
        if event["type"] != "node":
            continue
        node, phase = int(event["node_id"]), event["phase"]
        if phase in start_kinds and node not in open_at:
            open_at[node] = float(event["t"])
        elif phase in end_kinds and node in open_at:
            found.setdefault(node, []).append((open_at.pop(node), float(event["t"])))
    for node, t in open_at.items():
        found.setdefault(node, []).append((t, end_t))
    return found


def timeline_svg(events: list[Event], summary: dict[str, Any]) -> str:
    """The timeline picture as an SVG string (see the module docstring)."""
    events = sorted(events, key=lambda e: float(e["t"]))
    if not events:
        return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    t0, t1 = float(events[0]["t"]), float(events[-1]["t"])
    svg = _Svg(t0, t1)
    nodes = sorted({int(e["node_id"]) for e in events if e["type"] == "node"} | {1})
    n_rows = 2 + len(nodes) + 1
    height = 30 + n_rows * ROW + 2 * (PLOT + 30) + 30
    for window in summary.get("unavailability_windows", []):
        x0, x1 = svg.x(window["start"]), svg.x(window["end"])
        svg.add(
            f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 1):.1f}" height="{height}" fill="#ffdddd"/>'
        )
    # axis ticks every "nice" number of seconds
    step = _nice_step(svg.span / 1000 / 12)
    tick = 0.0
    while tick * 1000 <= svg.span:
        x = svg.x(t0 + tick * 1000)
        svg.add(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 20}" stroke="#eee"/>')
        svg.add(
            f'<text x="{x:.1f}" y="{height - 6}" font-size="10" text-anchor="middle">{tick:g}s</text>'
        )
        tick += step
    y = 10
    # faults
    svg.label("faults", y)
    started: dict[str, Event] = {}
    for event in events:
        if event["type"] != "nemesis":
            continue
        if event["phase"] == "start":
            started[event["name"]] = event
        elif event["phase"] == "stop" and event["name"] in started:
            begin = started.pop(event["name"])
            svg.bar(
                float(begin["t"]),
                float(event["t"]),
                y,
                "#d62728",
                f"{event['name']}: {event.get('detail')}",
            )
            svg.add(
                f'<text x="{svg.x(float(begin["t"])) + 2:.1f}" y="{y + 15}" font-size="10" fill="white">{html.escape(event["name"])}</text>'
            )
    for name, begin in started.items():
        svg.bar(float(begin["t"]), t1, y, "#d62728", name)
    y += ROW
    # nodes
    down = _intervals(events, {"kill", "stop"}, {"start"}, t1)
    paused = _intervals(events, {"pause"}, {"resume"}, t1)
    for node in nodes:
        svg.label(f"node {node}", y)
        svg.add(
            f'<rect x="{LEFT}" y="{y + 2}" width="{WIDTH - LEFT - RIGHT}" height="{ROW - 4}" fill="#e8f4e8"/>'
        )
        for a, b in down.get(node, []):
            svg.bar(a, b, y, "#333", f"node {node} down")
        for a, b in paused.get(node, []):
            svg.bar(a, b, y, "#ff7f0e", f"node {node} paused")
        y += ROW
    # leader
    svg.label("leader", y)
    leaders = [e for e in events if e["type"] == "leader"]
    for event, following in zip(leaders, [*leaders[1:], None], strict=True):
        end = float(following["t"]) if following is not None else t1
        leader_id = event.get("node_id")
        color = (
            "#ccc" if leader_id is None else NODE_COLORS[(int(leader_id) - 1) % len(NODE_COLORS)]
        )
        svg.bar(float(event["t"]), end, y, color, f"leader {leader_id} term {event.get('term')}")
    y += ROW + 20
    # publish latency
    invoked = {
        e["op"]: float(e["t"]) for e in events if e["type"] == "publish" and e["phase"] == "invoke"
    }
    points = [
        (float(e["t"]), float(e["t"]) - invoked[e["op"]], e["phase"])
        for e in events
        if e["type"] == "publish" and e["phase"] != "invoke" and e["op"] in invoked
    ]
    _scatter(
        svg,
        y,
        "publish latency",
        [(t, v, "#d62728" if p != "ok" else "#1f77b4") for t, v, p in points],
    )
    y += PLOT + 30
    lateness = [
        (
            float(e["t"]),
            float(e["t"]) - float(e["due_ms"]),
            "#2ca02c" if e.get("attempt", 1) == 1 else "#ff7f0e",
        )
        for e in events
        if e["type"] == "deliver"
    ]
    _scatter(svg, y, "delivery lateness", lateness)
    for window in summary.get("acked_then_redelivered_windows", []):
        svg.bar(
            window["start"],
            window["end"],
            y + PLOT,
            "#9467bd",
            f"{window['count']} acked then redelivered",
        )
    body = "\n".join(svg.parts)
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif">\n{body}\n</svg>'


def _nice_step(raw_s: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600):
        if step >= raw_s:
            return float(step)
    return 600.0 * math.ceil(raw_s / 600)


def _scatter(svg: _Svg, y: float, title: str, points: list[tuple[float, float, str]]) -> None:
    """Points on a log10 ms axis from 1 ms to the largest value."""
    svg.label(title, y)
    svg.add(
        f'<rect x="{LEFT}" y="{y}" width="{WIDTH - LEFT - RIGHT}" height="{PLOT}" fill="none" stroke="#999"/>'
    )
    top = max([v for _, v, _ in points] + [10.0])
    log_top = math.log10(max(top, 10.0))

    def to_y(value: float) -> float:
        return y + PLOT - (math.log10(max(value, 1.0)) / log_top) * PLOT

    for decade in range(int(log_top) + 1):
        ty = to_y(10.0**decade)
        svg.add(
            f'<text x="{LEFT - 4}" y="{ty + 3:.0f}" font-size="9" text-anchor="end">{10**decade:g} ms</text>'
        )
    stride = max(1, len(points) // 20_000)  # keep the file small on long runs
    for t, value, color in points[::stride]:
        svg.add(f'<circle cx="{svg.x(t):.1f}" cy="{to_y(value):.1f}" r="1.5" fill="{color}"/>')


def write_timeline(events: list[Event], summary: dict[str, Any], path: Path) -> None:
    """Write ``timeline.html``: the verdicts as a list, then the SVG timeline."""
    verdicts = "".join(
        f"<li>{html.escape(name)}: <b>{summary.get(name, 0)}</b></li>" for name in MUST_BE_ZERO
    )
    legend = (
        "Red shading: publishes failing or slower than 2 s. Faults in red; node rows: black "
        "down, orange paused; leader colour per node (grey: none). Latency dots: blue ok, "
        "red failed/unknown; lateness dots: green first attempt, orange redelivery; purple: "
        "acked then redelivered."
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>FutureQ jepsen_like run</title></head>"
        f"<body style='font-family:sans-serif'><h2>FutureQ jepsen_like — seed {summary.get('seed')}</h2>"
        f"<p><code>{html.escape(str(summary.get('reproduce', '')))}</code></p><ul>{verdicts}</ul>"
        f"<p>{legend}</p>{timeline_svg(events, summary)}</body></html>"
    )
    path.write_text(page)
