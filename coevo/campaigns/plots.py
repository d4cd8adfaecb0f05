"""Server-side SVG plots for the campaign page: pure functions from data to SVG strings.

No JavaScript library and no CDN: the page embeds these strings inline. Every piece of text
that reaches the SVG goes through ``_esc`` (labels can carry user-written commit subjects),
so the output is well-formed XML whatever the data, and an empty data set still draws its
axes with a "no data yet" note instead of failing.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WIDTH = 640
HEIGHT = 280
MARGIN_LEFT = 52
MARGIN_RIGHT = 16
MARGIN_TOP = 28  # room for the legend
MARGIN_BOTTOM = 44

SEARCH_COLOR = "#0969da"
VALIDATION_COLOR = "#bc4c00"
BEST_COLOR = "#1a7f37"
MUTED_COLOR = "#8c959f"
AXIS_COLOR = "#57606a"
GRID_COLOR = "#eaeef2"

# Above this many points a plot summarizes: the scores plot draws each column of proposals as
# its range, the Pareto plot gathers dominated points into cells (a campaign of 2,000
# proposals drew 3,000 shapes, most of the page's 870 KB). What the reader acts on (new bests,
# the front) is always drawn point by point, with its link.
PLOT_MAX_POINTS = 400
SCORE_BINS = 160
PARETO_CELL = 16  # px: dominated points in one such square share a mark (at most ~500 marks)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float) -> str:
    """Coordinates with two decimals at most (short, stable output)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 × 10^k) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high < low:
        low, high = high, low
    if high == low:
        return [low]
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    # The round step whose tick count comes closest to the one asked for.
    step = min(
        (m * magnitude for m in (1, 2, 5, 10)), key=lambda st: abs((high - low) / st - count)
    )
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        # round() keeps 0.30000000000000004 out of the labels.
        ticks.append(round(value, 10))
        value += step
    return ticks


def _tick_label(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


@dataclass(frozen=True)
class _Frame:
    """A plot area with linear x and y scales over the given domains."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def left(self) -> float:
        return MARGIN_LEFT

    @property
    def right(self) -> float:
        return self.width - MARGIN_RIGHT

    @property
    def top(self) -> float:
        return MARGIN_TOP

    @property
    def bottom(self) -> float:
        return self.height - MARGIN_BOTTOM

    def x(self, value: float) -> float:
        span = self.x_high - self.x_low
        if span == 0:
            return (self.left + self.right) / 2
        return self.left + (value - self.x_low) / span * (self.right - self.left)

    def y(self, value: float) -> float:
        span = self.y_high - self.y_low
        if span == 0:
            return (self.top + self.bottom) / 2
        return self.bottom - (value - self.y_low) / span * (self.bottom - self.top)


def _open(title: str, element_id: str, width: int, height: int, css_class: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{_esc(element_id)}" '
        f'class="{_esc(css_class)}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-labelledby="{_esc(element_id)}-title" '
        'font-family="system-ui, sans-serif" font-size="11">',
        f'<title id="{_esc(element_id)}-title">{_esc(title)}</title>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]


def _axes(
    frame: _Frame,
    *,
    x_ticks: Sequence[float],
    y_ticks: Sequence[float],
    x_label: str,
    y_label: str,
) -> list[str]:
    parts = ['<g class="axes">']
    for tick in y_ticks:
        y = _num(frame.y(tick))
        parts.append(
            f'<line x1="{_num(frame.left)}" y1="{y}" x2="{_num(frame.right)}" y2="{y}" '
            f'stroke="{GRID_COLOR}"/>'
        )
        parts.append(
            f'<text class="tick y-tick" x="{_num(frame.left - 6)}" y="{y}" text-anchor="end" '
            f'dominant-baseline="middle" fill="{AXIS_COLOR}">{_esc(_tick_label(tick))}</text>'
        )
    for tick in x_ticks:
        x = _num(frame.x(tick))
        parts.append(
            f'<line x1="{x}" y1="{_num(frame.bottom)}" x2="{x}" y2="{_num(frame.bottom + 4)}" '
            f'stroke="{AXIS_COLOR}"/>'
        )
        parts.append(
            f'<text class="tick x-tick" x="{x}" y="{_num(frame.bottom + 16)}" '
            f'text-anchor="middle" fill="{AXIS_COLOR}">{_esc(_tick_label(tick))}</text>'
        )
    parts.append(
        f'<line x1="{_num(frame.left)}" y1="{_num(frame.bottom)}" x2="{_num(frame.right)}" '
        f'y2="{_num(frame.bottom)}" stroke="{AXIS_COLOR}"/>'
    )
    parts.append(
        f'<line x1="{_num(frame.left)}" y1="{_num(frame.top)}" x2="{_num(frame.left)}" '
        f'y2="{_num(frame.bottom)}" stroke="{AXIS_COLOR}"/>'
    )
    middle_x = _num((frame.left + frame.right) / 2)
    parts.append(
        f'<text class="axis-label x-label" x="{middle_x}" y="{frame.height - 6}" '
        f'text-anchor="middle" fill="{AXIS_COLOR}">{_esc(x_label)}</text>'
    )
    middle_y = _num((frame.top + frame.bottom) / 2)
    parts.append(
        f'<text class="axis-label y-label" x="14" y="{middle_y}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle_y})" fill="{AXIS_COLOR}">{_esc(y_label)}</text>'
    )
    parts.append("</g>")
    return parts


def _legend(entries: Sequence[tuple[str, str, str]], frame: _Frame) -> list[str]:
    """``(label, color, marker)`` with marker ``dot``, ``square``, ``line`` or ``dash``."""
    parts = ['<g class="legend">']
    x = frame.left
    for label, color, marker in entries:
        if marker == "dot":
            parts.append(f'<circle cx="{_num(x + 5)}" cy="12" r="4" fill="{color}"/>')
        elif marker == "square":
            parts.append(f'<rect x="{_num(x + 1)}" y="8" width="8" height="8" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="4 3"' if marker == "dash" else ""
            parts.append(
                f'<line x1="{_num(x)}" y1="12" x2="{_num(x + 12)}" y2="12" stroke="{color}" '
                f'stroke-width="2"{dash}/>'
            )
        parts.append(f'<text x="{_num(x + 16)}" y="16" fill="{AXIS_COLOR}">{_esc(label)}</text>')
        x += 28 + 6.5 * len(label)
    parts.append("</g>")
    return parts


def _empty_note(frame: _Frame, text: str) -> str:
    return (
        f'<text class="empty" x="{_num((frame.left + frame.right) / 2)}" '
        f'y="{_num((frame.top + frame.bottom) / 2)}" text-anchor="middle" '
        f'fill="{MUTED_COLOR}">{_esc(text)}</text>'
    )


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _score_domain(values: Sequence[float]) -> tuple[float, float]:
    # Scores live in [0, 1]; a suite with larger scores widens the axis rather than clipping.
    return min([0.0, *values]), max([1.0, *values])


def _summary_note(frame: _Frame, text: str) -> str:
    return (
        f'<text class="summary-note" x="{_num(frame.right)}" y="16" text-anchor="end" '
        f'fill="{MUTED_COLOR}">{_esc(text)}</text>'
    )


def _range_text(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.3f}" if low == high else f"{low:.3f}–{high:.3f}"


# --- scores over proposals -------------------------------------------------------------------


def scores_plot_svg(*, series: Sequence[Mapping[str, Any]], element_id: str = "plot-scores") -> str:
    """Search and validation scores per proposal (x: proposal number), with the best
    validation score so far as a step line; a validation point is marked best when its row
    says it ``improved`` (a tie with the best is not). ``series`` rows are
    ``{"sequence", "search_score", "validation_score", "improved", "best_validation_score"}``
    (``coevo.campaigns.selectors.campaign_best_series``); a missing score is ``None``."""
    rows = [row for row in series if _finite(row.get("sequence")) is not None]
    sequences = [float(row["sequence"]) for row in rows]
    values = [
        v
        for row in rows
        for v in (_finite(row.get("search_score")), _finite(row.get("validation_score")))
        if v is not None
    ]
    x_low, x_high = (min(sequences), max(sequences)) if sequences else (0.0, 1.0)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    frame = _Frame(x_low, x_high, *_score_domain(values))
    x_ticks = [t for t in nice_ticks(x_low, x_high, 8) if float(t).is_integer()]
    parts = _open(
        "Search and validation scores per proposal, best validation so far",
        element_id,
        frame.width,
        frame.height,
        "plot plot-scores",
    )
    parts += _axes(
        frame,
        x_ticks=x_ticks,
        y_ticks=nice_ticks(frame.y_low, frame.y_high, 5),
        x_label="proposal",
        y_label="score",
    )
    parts += _legend(
        [
            ("search", SEARCH_COLOR, "dot"),
            ("validation", VALIDATION_COLOR, "square"),
            ("best validation so far", BEST_COLOR, "line"),
        ],
        frame,
    )
    if not values:
        parts.append(_empty_note(frame, "no scored proposal yet"))
        parts.append("</svg>")
        return "\n".join(parts)

    # Best so far: a step line that holds its value until a proposal beats it.
    steps: list[str] = []
    drawn_best = None
    for row in rows:
        best = _finite(row.get("best_validation_score"))
        if best is None or best == drawn_best:
            continue
        x, y = frame.x(float(row["sequence"])), frame.y(best)
        steps.append(f"H{_num(x)} V{_num(y)}" if steps else f"M{_num(x)} {_num(y)}")
        drawn_best = best
    if steps:
        last_x = _num(frame.x(x_high))
        parts.append(
            f'<path class="best-line" d="{" ".join(steps)} H{last_x}" fill="none" '
            f'stroke="{BEST_COLOR}" stroke-width="2"/>'
        )
    parts.append('<g class="points">')
    if len(rows) > PLOT_MAX_POINTS:
        parts += _score_columns(rows, frame)
        parts.append(_summary_note(frame, f"{len(rows):,} proposals: ranges per column"))
    for row in rows:
        sequence = float(row["sequence"])
        x = frame.x(sequence)
        search = _finite(row.get("search_score"))
        validation = _finite(row.get("validation_score"))
        improved = bool(row.get("improved"))
        if len(rows) > PLOT_MAX_POINTS and not (improved and validation is not None):
            continue  # in its column's range
        label = _tick_label(sequence)
        if search is not None:
            parts.append(
                f'<circle class="point search" cx="{_num(x)}" cy="{_num(frame.y(search))}" '
                f'r="4" fill="{SEARCH_COLOR}" fill-opacity="0.8"><title>'
                f"#{_esc(label)} search {search:.3f}</title></circle>"
            )
        if validation is not None:
            y = frame.y(validation)
            stroke = f' stroke="{BEST_COLOR}" stroke-width="2"' if improved else ""
            parts.append(
                f'<rect class="point validation{" best" if improved else ""}" '
                f'x="{_num(x - 4)}" y="{_num(y - 4)}" width="8" height="8" '
                f'fill="{VALIDATION_COLOR}"{stroke}><title>#{_esc(label)} validation '
                f"{validation:.3f}</title></rect>"
            )
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _score_columns(rows: Sequence[Mapping[str, Any]], frame: _Frame) -> list[str]:
    """Proposals grouped into ``SCORE_BINS`` columns along x, each drawn as the range of its
    search scores and of its validation scores (a bar from the lowest to the highest), with a
    tooltip naming the proposals and the ranges."""
    columns: dict[int, list[Mapping[str, Any]]] = {}
    width = frame.right - frame.left
    for row in rows:
        x = frame.x(float(row["sequence"]))
        columns.setdefault(
            min(int((x - frame.left) / width * SCORE_BINS), SCORE_BINS - 1), []
        ).append(row)
    parts = []
    for column in sorted(columns):
        members = columns[column]
        x = _num(frame.left + (column + 0.5) / SCORE_BINS * width)
        first, last = (
            _tick_label(float(members[0]["sequence"])),
            _tick_label(float(members[-1]["sequence"])),
        )
        for kind, color, key in (
            ("search", SEARCH_COLOR, "search_score"),
            ("validation", VALIDATION_COLOR, "validation_score"),
        ):
            values = [v for v in (_finite(m.get(key)) for m in members) if v is not None]
            if not values:
                continue
            top, bottom = _num(frame.y(max(values))), _num(frame.y(min(values)))
            title = f"#{first}–#{last}: {kind} {_range_text(values)} ({len(values)} proposals)"
            parts.append(
                f'<line class="column {kind}" x1="{x}" y1="{bottom}" x2="{x}" y2="{top}" '
                f'stroke="{color}" stroke-opacity="0.5" stroke-width="3" stroke-linecap="round">'
                f"<title>{_esc(title)}</title></line>"
            )
    return parts


# --- Pareto front ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ParetoPoint:
    label: str  # e.g. "#3 1a2b3c4"
    tokens_per_task: float
    validation_score: float
    on_front: bool
    href: str = ""


def pareto_plot_svg(*, points: Sequence[ParetoPoint], element_id: str = "plot-pareto") -> str:
    """Validation score (↑) against policy tokens per task (↓); front points are filled and
    joined by the front's staircase, the dominated ones drawn hollow and grey."""
    usable = [
        p
        for p in points
        if _finite(p.tokens_per_task) is not None and _finite(p.validation_score) is not None
    ]
    xs = [float(p.tokens_per_task) for p in usable]
    ys = [float(p.validation_score) for p in usable]
    x_low, x_high = (0.0, max(xs) * 1.1 if xs and max(xs) > 0 else 1.0)
    frame = _Frame(x_low, x_high, *_score_domain(ys))
    parts = _open(
        "Pareto front: validation score against policy tokens per task",
        element_id,
        frame.width,
        frame.height,
        "plot plot-pareto",
    )
    parts += _axes(
        frame,
        x_ticks=nice_ticks(x_low, x_high, 6),
        y_ticks=nice_ticks(frame.y_low, frame.y_high, 5),
        x_label="policy tokens per task (lower is better)",
        y_label="validation score",
    )
    parts += _legend(
        [("on the front", BEST_COLOR, "dot"), ("dominated", MUTED_COLOR, "dot")], frame
    )
    if not usable:
        parts.append(_empty_note(frame, "no validated proposal yet"))
        parts.append("</svg>")
        return "\n".join(parts)

    front = sorted((p for p in usable if p.on_front), key=lambda p: p.tokens_per_task)
    if len(front) > 1:
        # The staircase: moving right (more tokens) only pays off with a higher score.
        d = [
            f"M{_num(frame.x(front[0].tokens_per_task))} {_num(frame.y(front[0].validation_score))}"
        ]
        for p in front[1:]:
            d.append(f"H{_num(frame.x(p.tokens_per_task))} V{_num(frame.y(p.validation_score))}")
        parts.append(
            f'<path class="front-line" d="{" ".join(d)}" fill="none" stroke="{BEST_COLOR}" '
            'stroke-width="1.5" stroke-dasharray="4 3"/>'
        )
    parts.append('<g class="points">')
    dominated = [p for p in usable if not p.on_front]
    on_front = [p for p in usable if p.on_front]
    if len(dominated) > PLOT_MAX_POINTS:
        parts += _dominated_cells(dominated, frame)
        parts.append(_summary_note(frame, f"{len(dominated):,} dominated proposals in cells"))
        drawn = on_front
    else:
        drawn = dominated + on_front  # dominated first, so the front is drawn on top
    for p in drawn:
        x, y = _num(frame.x(p.tokens_per_task)), _num(frame.y(p.validation_score))
        title = (
            f"{p.label}: validation {p.validation_score:.3f}, "
            f"{p.tokens_per_task:.1f} tokens/task{' (front)' if p.on_front else ''}"
        )
        if p.on_front:
            shape = (
                f'<circle class="point front" cx="{x}" cy="{y}" r="6" fill="{BEST_COLOR}">'
                f"<title>{_esc(title)}</title></circle>"
            )
        else:
            shape = (
                f'<circle class="point dominated" cx="{x}" cy="{y}" r="4" fill="#ffffff" '
                f'stroke="{MUTED_COLOR}" stroke-width="1.5"><title>{_esc(title)}</title></circle>'
            )
        parts.append(f'<a href="{_esc(p.href)}">{shape}</a>' if p.href else shape)
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _dominated_cells(points: Sequence[ParetoPoint], frame: _Frame) -> list[str]:
    """Dominated points gathered into ``PARETO_CELL``-pixel cells: one hollow mark per cell at
    its points' mean, larger with more points, its tooltip the count and the ranges."""
    cells: dict[tuple[int, int], list[ParetoPoint]] = {}
    for p in points:
        key = (
            int(frame.x(p.tokens_per_task) // PARETO_CELL),
            int(frame.y(p.validation_score) // PARETO_CELL),
        )
        cells.setdefault(key, []).append(p)
    parts = []
    for key in sorted(cells):
        members = cells[key]
        x = sum(frame.x(p.tokens_per_task) for p in members) / len(members)
        y = sum(frame.y(p.validation_score) for p in members) / len(members)
        radius = min(3 + math.log2(len(members)), 8)
        scores = [p.validation_score for p in members]
        tokens = [p.tokens_per_task for p in members]
        noun = "proposal" if len(members) == 1 else "proposals"
        title = (
            f"{len(members)} dominated {noun}: validation {_range_text(scores)}, "
            f"{min(tokens):.1f}–{max(tokens):.1f} tokens/task"
        )
        parts.append(
            f'<circle class="cell dominated" cx="{_num(x)}" cy="{_num(y)}" '
            f'r="{_num(radius)}" fill="#ffffff" stroke="{MUTED_COLOR}" stroke-width="1.5">'
            f"<title>{_esc(title)}</title></circle>"
        )
    return parts


# --- lineage ---------------------------------------------------------------------------------

NODE_WIDTH = 92
NODE_HEIGHT = 36
COLUMN_GAP = 20
ROW_GAP = 38
LINEAGE_PAD = 12

NODE_STYLES = {
    # status -> (fill, stroke)
    "seed": ("#ddf4ff", SEARCH_COLOR),
    "best": ("#dafbe1", BEST_COLOR),
    "evaluated": ("#ffffff", AXIS_COLOR),
    "pruned": ("#f6f8fa", MUTED_COLOR),
    "failed": ("#ffebe9", "#cf222e"),
    "open": ("#fff8c5", "#9a6700"),
}


@dataclass
class LineageNode:
    sha: str
    parents: list[str] = field(default_factory=list)
    label: str = ""  # second line, e.g. "#3 config"
    href: str = ""
    status: str = "evaluated"  # a NODE_STYLES key
    title: str = ""  # the tooltip, e.g. the commit subject


def lineage_layout(nodes: Sequence[LineageNode]) -> dict[str, tuple[int, int]]:
    """sha -> (generation, column). A node's generation is one more than its deepest parent
    among ``nodes`` (parents outside the campaign are ignored), so a merge sits below both of
    its parents; within a generation nodes are ordered by their parents' mean column (one
    barycentre pass, which keeps most edges from crossing) and then by input order."""
    by_sha = {node.sha: node for node in nodes}
    parents_in = {sha: [p for p in node.parents if p in by_sha] for sha, node in by_sha.items()}
    # Kahn's order (iterative: a long chain of improvements must not hit the recursion limit).
    waiting = {sha: len(set(parents)) for sha, parents in parents_in.items()}
    children: dict[str, list[str]] = {}
    for sha, parents in parents_in.items():
        for parent in set(parents):
            children.setdefault(parent, []).append(sha)
    ready = [node.sha for node in nodes if waiting[node.sha] == 0]
    generation: dict[str, int] = {}
    while ready:
        sha = ready.pop()
        generation[sha] = 1 + max((generation[p] for p in parents_in[sha]), default=-1)
        for child in children.get(sha, []):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    for node in nodes:
        # Only a cycle (impossible in git, possible in hand-made data) is left: a root row.
        generation.setdefault(node.sha, 0)
    order = {node.sha: i for i, node in enumerate(nodes)}
    rows: dict[int, list[str]] = {}
    for node in nodes:
        rows.setdefault(generation[node.sha], []).append(node.sha)
    layout: dict[str, tuple[int, int]] = {}
    for level in sorted(rows):

        def barycentre(sha: str) -> tuple[float, int]:
            columns = [layout[p][1] for p in by_sha[sha].parents if p in layout]
            return (sum(columns) / len(columns) if columns else -1.0, order[sha])

        for column, sha in enumerate(sorted(rows[level], key=barycentre)):
            layout[sha] = (level, column)
    return layout


def lineage_svg(*, nodes: Sequence[LineageNode], element_id: str = "plot-lineage") -> str:
    """The campaign's candidates as a DAG from their parent SHAs, one row per generation
    (merges have two incoming edges); each node links to its candidate page."""
    unique: dict[str, LineageNode] = {}
    for node in nodes:
        unique.setdefault(node.sha, node)
    nodes = list(unique.values())
    layout = lineage_layout(nodes)
    columns = max((column for _, column in layout.values()), default=0) + 1
    rows = max((level for level, _ in layout.values()), default=0) + 1
    width = max(WIDTH // 2, 2 * LINEAGE_PAD + columns * NODE_WIDTH + (columns - 1) * COLUMN_GAP)
    height = 2 * LINEAGE_PAD + rows * NODE_HEIGHT + (rows - 1) * ROW_GAP
    parts = _open(
        "Lineage of the campaign's candidates", element_id, width, height, "plot plot-lineage"
    )
    if not nodes:
        parts.append(
            f'<text class="empty" x="{width // 2}" y="{height // 2}" text-anchor="middle" '
            f'fill="{MUTED_COLOR}">no candidate yet</text>'
        )
        parts.append("</svg>")
        return "\n".join(parts)

    def box(sha: str) -> tuple[float, float]:
        level, column = layout[sha]
        return (
            LINEAGE_PAD + column * (NODE_WIDTH + COLUMN_GAP),
            LINEAGE_PAD + level * (NODE_HEIGHT + ROW_GAP),
        )

    parts.append('<g class="edges">')
    for node in nodes:
        child_x, child_y = box(node.sha)
        for index, parent in enumerate(p for p in node.parents if p in layout):
            parent_x, parent_y = box(parent)
            x1, y1 = parent_x + NODE_WIDTH / 2, parent_y + NODE_HEIGHT
            x2, y2 = child_x + NODE_WIDTH / 2, child_y
            bend = (y2 - y1) / 2
            merge = " merge-edge" if len(node.parents) > 1 else ""
            dash = ' stroke-dasharray="5 3"' if index > 0 else ""
            parts.append(
                f'<path class="edge{merge}" data-from="{_esc(parent)}" data-to="{_esc(node.sha)}" '
                f'd="M{_num(x1)} {_num(y1)} C{_num(x1)} {_num(y1 + bend)} {_num(x2)} '
                f'{_num(y2 - bend)} {_num(x2)} {_num(y2)}" fill="none" stroke="{AXIS_COLOR}" '
                f'stroke-width="1.5"{dash}/>'
            )
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for node in nodes:
        x, y = box(node.sha)
        fill, stroke = NODE_STYLES.get(node.status, NODE_STYLES["evaluated"])
        width_px = 2.5 if node.status == "best" else 1.5
        tooltip = node.title or node.sha
        inner = [
            f'<g class="node status-{_esc(node.status)}" data-sha="{_esc(node.sha)}">',
            f"<title>{_esc(node.sha[:12])} {_esc(tooltip)}</title>",
            f'<rect x="{_num(x)}" y="{_num(y)}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" '
            f'rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{width_px}"/>',
            f'<text x="{_num(x + NODE_WIDTH / 2)}" y="{_num(y + 15)}" text-anchor="middle" '
            f'font-family="ui-monospace, monospace" fill="#1f2328">{_esc(node.sha[:7])}</text>',
            f'<text x="{_num(x + NODE_WIDTH / 2)}" y="{_num(y + 29)}" text-anchor="middle" '
            f'fill="{AXIS_COLOR}" font-size="10">{_esc(node.label[:18])}</text>',
            "</g>",
        ]
        if node.href:
            parts.append(
                f'<a class="lineage-link" href="{_esc(node.href)}" '
                f'aria-label="candidate {_esc(node.sha[:7])}">'
            )
            parts += inner
            parts.append("</a>")
        else:
            parts += inner
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)
