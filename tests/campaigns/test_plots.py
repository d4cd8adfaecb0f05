"""The campaign page's SVG plots: well-formed XML whatever the data, escaped, with axes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from coevo.campaigns.plots import (
    LineageNode,
    ParetoPoint,
    lineage_layout,
    lineage_svg,
    nice_ticks,
    pareto_plot_svg,
    scores_plot_svg,
)

NS = {"svg": "http://www.w3.org/2000/svg"}
EVIL = "<script>alert(\"x\")</script> & 'quotes'"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def row(sequence, search, validation, improved, best) -> dict:
    """One campaign_best_series row."""
    return {
        "sequence": sequence,
        "search_score": search,
        "validation_score": validation,
        "improved": improved,
        "best_validation_score": best,
    }


SERIES = [
    row(0, 0.25, 0.5, True, 0.5),
    row(1, 0.5, None, False, 0.5),
    row(2, 0.75, 0.25, False, 0.5),
    row(3, 1.0, 1.0, True, 1.0),
]


def validation_classes(root: ET.Element) -> list[str]:
    rects = root.findall(".//svg:rect[@class]", NS)
    return [r.get("class") for r in rects if "validation" in r.get("class")]


def test_it_draws_scores_with_axes_ticks_and_the_best_so_far_line():
    root = parse(scores_plot_svg(series=SERIES))

    labels = texts(root)
    assert "proposal" in labels and "score" in labels
    assert {"0", "0.2", "0.4", "0.6", "0.8", "1"} <= set(labels)  # y ticks
    assert {"0", "1", "2", "3"} <= set(labels)  # x ticks, integers only
    assert len(root.findall(".//svg:circle[@class='point search']", NS)) == 4
    assert validation_classes(root) == [
        "point validation best",
        "point validation",
        "point validation best",
    ]
    best = root.find(".//svg:path[@class='best-line']", NS)
    # A step line: holds 0.5 until proposal 3 lifts it to 1.0 (y runs downwards); it turns
    # only where the best changes.
    assert best is not None and best.get("d").count("V") == 1


def test_it_marks_as_best_only_the_points_that_improved_not_a_tie():
    # #1 ties the best (0.5): the runner recorded no improvement, and the table says so.
    root = parse(
        scores_plot_svg(series=[row(0, 0.5, 0.5, True, 0.5), row(1, 0.5, 0.5, False, 0.5)])
    )
    assert validation_classes(root) == ["point validation best", "point validation"]


def test_it_draws_empty_plots_with_a_note():
    for svg in (
        scores_plot_svg(series=[]),
        pareto_plot_svg(points=[]),
        lineage_svg(nodes=[]),
        scores_plot_svg(series=[{"sequence": 0, "search_score": None}]),
    ):
        root = parse(svg)
        assert root.find(".//svg:text[@class='empty']", NS) is not None


def test_it_escapes_every_label():
    svg = pareto_plot_svg(
        points=[ParetoPoint(EVIL, 10.0, 0.5, True, href='/c/"onmouseover=x')]
    ) + lineage_svg(nodes=[LineageNode(sha="a" * 40, label=EVIL, title=EVIL, href="/x?a=1&b=2")])
    assert "<script>" not in svg and 'href="/c/"onmouseover' not in svg
    for part in svg.split("</svg>")[:-1]:
        root = parse(part + "</svg>")
        assert root is not None
    lineage = parse(lineage_svg(nodes=[LineageNode(sha="a" * 40, title=EVIL, href="/x?a=1&b=2")]))
    link = lineage.find(".//svg:a", NS)
    assert link.get("href") == "/x?a=1&b=2"
    assert EVIL in "".join(
        lineage.find(".//svg:g[@class='node status-evaluated']/svg:title", NS).itertext()
    )


def test_it_highlights_the_pareto_front_and_ignores_unusable_points():
    points = [
        ParetoPoint("#1", 100.0, 0.8, True, href="/c/1/"),
        ParetoPoint("#2", 50.0, 0.5, True, href="/c/2/"),
        ParetoPoint("#3", 120.0, 0.4, False, href="/c/3/"),
        ParetoPoint("#4", float("nan"), 0.9, False),
    ]
    root = parse(pareto_plot_svg(points=points))
    assert len(root.findall(".//svg:circle[@class='point front']", NS)) == 2
    assert len(root.findall(".//svg:circle[@class='point dominated']", NS)) == 1
    assert root.find(".//svg:path[@class='front-line']", NS) is not None
    assert "validation score" in texts(root)
    assert [a.get("href") for a in root.findall(".//svg:a", NS)] == ["/c/3/", "/c/1/", "/c/2/"]


def test_it_lays_out_the_lineage_by_generation_with_a_merge_below_both_parents():
    nodes = [
        LineageNode(sha="s" * 40, parents=["outside" * 5], label="seed", href="/c/s/"),
        LineageNode(sha="a" * 40, parents=["s" * 40], label="#1 config"),
        LineageNode(sha="b" * 40, parents=["s" * 40], label="#2 llm-patch"),
        LineageNode(sha="c" * 40, parents=["a" * 40], label="#3 config"),
        LineageNode(sha="m" * 40, parents=["c" * 40, "b" * 40], label="#4 merge"),
        LineageNode(sha="a" * 40, parents=["s" * 40], label="duplicate, dropped"),
    ]
    layout = lineage_layout(nodes[:5])
    assert {sha[0]: level for sha, (level, _) in layout.items()} == {
        "s": 0,
        "a": 1,
        "b": 1,
        "c": 2,
        "m": 3,
    }
    root = parse(lineage_svg(nodes=nodes))
    assert len(root.findall(".//svg:g[@data-sha]", NS)) == 5
    merge_edges = root.findall(".//svg:path[@data-to='" + "m" * 40 + "']", NS)
    assert {e.get("data-from") for e in merge_edges} == {"c" * 40, "b" * 40}
    assert all("merge-edge" in e.get("class") for e in merge_edges)
    # The parent outside the campaign draws no edge.
    assert len(root.findall(".//svg:path[@class='edge']", NS)) == 3
    assert root.find(".//svg:a", NS).get("href") == "/c/s/"


def test_it_lays_out_a_long_chain_without_recursion():
    nodes = [
        LineageNode(sha=f"{i:040x}", parents=[f"{i - 1:040x}"] if i else []) for i in range(3000)
    ]
    layout = lineage_layout(nodes)
    assert layout[f"{2999:040x}"] == (2999, 0)


def test_it_picks_round_ticks():
    assert nice_ticks(0, 1, 5) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 130, 6) == [0, 20, 40, 60, 80, 100, 120]
    assert nice_ticks(3, 3) == [3]
    assert nice_ticks(float("nan"), 1) == []


def test_the_pareto_sweep_agrees_with_comparing_every_pair():
    import random

    from coevo.campaigns.selectors import pareto_front

    def brute(points):
        return {
            p
            for p in points
            if not any(
                q[0] >= p[0] and q[1] <= p[1] and (q[0] > p[0] or q[1] < p[1]) for q in points
            )
        }

    rng = random.Random(7)
    for _ in range(300):
        # Few distinct values: ties in score, in cost and whole duplicates are common.
        points = [
            (rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]), rng.choice([10, 20, 30, 40]), i)
            for i in range(rng.randint(0, 25))
        ]
        front = pareto_front(points, score=lambda p: p[0], cost=lambda p: p[1])
        assert set(front) == brute(points)
        assert [p[0] for p in front] == sorted((p[0] for p in front), reverse=True)
