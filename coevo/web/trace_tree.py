"""A program harness's calls as a tree, for the rollout page: the session overview above the
steps, and each shown call's place ("call #3 · session 1 · continues #2") with a link to its
parent's step wherever that step is in the paged trace.

workers/program.py records a boundary call's place (``call``, ``session``, ``parent``,
``relation``) on its step; ``call_tree`` builds the tree from the rows ``rollout_call_tree``
reads (one query, over those keys only).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coevo.evaluations.selectors import CallRow
from workers.trace import ModelCall

# The overview lists this many calls (the first, in step order; the steps page on past it).
OVERVIEW_MAX_CALLS = 500
# Indentation stops here: a deeper branch is drawn at this depth (its label names its parent).
MAX_DEPTH = 12
RELATION_WORDS = {
    "starts": "starts",
    "continues": "continues",
    "repeats": "repeats",
    "branches": "branches from",
}


@dataclass(frozen=True)
class StepLink:
    """Where a call's step is: an anchor on this page, or the page that starts at it."""

    attempt: int
    index: int
    on_page: bool

    @property
    def href(self) -> str:
        anchor = f"#step-{self.attempt}-{self.index}"
        return anchor if self.on_page else f"?from={self.attempt}.{self.index}{anchor}"


@dataclass
class CallNode:
    row: CallRow
    link: StepLink
    children: list[CallNode] = field(default_factory=list)

    @property
    def call(self) -> int:
        return self.row.call

    @property
    def relation(self) -> str:
        return self.row.relation or ""


@dataclass(frozen=True)
class TreeLine:
    """A conversation's run of calls, each continuing the one before, on one line; a call
    that forks off it (a branch, a repeat, a second continuation) starts a line one level
    deeper, after it, naming the call it forks from."""

    depth: int
    calls: list[CallNode]
    parent: CallNode | None

    @property
    def relation_words(self) -> str:
        return RELATION_WORDS.get(self.calls[0].relation, self.calls[0].relation)

    @property
    def indent(self) -> int:
        return min(self.depth, MAX_DEPTH)


@dataclass(frozen=True)
class SessionView:
    attempt: int
    number: int  # 1, 2, … in the order the attempt's sessions started
    root: int  # the call that started it
    calls: int
    lines: list[TreeLine]


@dataclass(frozen=True)
class CallPlace:
    """ "call #3 · session 1 · continues #2", with the link to #2's step."""

    call: int
    session: int | None  # the session's number; None: refused before it had a place
    relation: str
    parent: int | None
    parent_link: StepLink | None

    @property
    def relation_words(self) -> str:
        return RELATION_WORDS.get(self.relation, self.relation)


@dataclass
class CallTree:
    rows: dict[tuple[int, int], CallRow]  # (attempt, call) → its row
    on_page: set[tuple[int, int]]  # (attempt, index) of the shown steps
    numbers: dict[tuple[int, int], int]  # (attempt, session) → the session's number
    total: int  # model calls in the trace
    complete: bool  # whether ``rows`` holds every call (else a prefix, in step order)
    attempts: int
    sessions: list[SessionView] = field(default_factory=list)
    refused: list[CallNode] = field(default_factory=list)  # refused: no place in the tree
    shown: int = 0  # calls the overview lists

    @property
    def session_count(self) -> int | None:
        return len(self.numbers) if self.complete else None

    def link(self, row: CallRow) -> StepLink:
        return StepLink(row.attempt, row.index, (row.attempt, row.index) in self.on_page)

    def place(self, attempt: int, step: ModelCall) -> CallPlace | None:
        """A shown call's place (built for the page's calls only: a long trace has
        thousands of rows and a page a hundred). A call past the rows read keeps what its
        step says, without the session's number or a link to its parent."""
        call = step.call
        if not isinstance(call, int):
            return None
        row = self.rows.get((attempt, call))
        if row is None:
            parent = step.parent
            return CallPlace(
                call=call,
                session=None,
                relation=str(step.relation or ""),
                parent=parent if isinstance(parent, int) else None,
                parent_link=None,
            )
        parent_row = self.rows.get((attempt, row.parent)) if row.parent is not None else None
        return CallPlace(
            call=row.call,
            session=self.numbers.get((attempt, row.session)) if row.session is not None else None,
            relation=row.relation or "",
            parent=row.parent,
            parent_link=self.link(parent_row) if parent_row is not None else None,
        )


def call_tree(
    rows: list[CallRow],
    *,
    on_page: Iterable[tuple[int, int]],
    total: int | None = None,
    complete: bool = True,
) -> CallTree:
    """The call tree of a rollout's ``rows`` (``rollout_call_tree``: every call, or the
    first ones when not ``complete``; ``total``: how many there are), its steps linked as
    anchors where ``on_page`` (the shown steps' (attempt, index)) holds them."""
    by_call: dict[tuple[int, int], CallRow] = {}
    # Sessions numbered per attempt, in the order they started (step order).
    numbers: dict[tuple[int, int], int] = {}
    per_attempt: dict[int, int] = {}
    for row in rows:
        key = (row.attempt, row.call)
        if key in by_call:
            continue
        by_call[key] = row
        per_attempt.setdefault(row.attempt, 0)
        if row.session is not None and (row.attempt, row.session) not in numbers:
            per_attempt[row.attempt] += 1
            numbers[(row.attempt, row.session)] = per_attempt[row.attempt]
    tree = CallTree(
        rows=by_call,
        on_page=set(on_page),
        numbers=numbers,
        total=max(total or 0, len(by_call)),
        complete=complete,
        attempts=len(per_attempt),
    )
    listed = list(by_call.values())[:OVERVIEW_MAX_CALLS]
    tree.sessions, tree.refused = _sessions([CallNode(r, tree.link(r)) for r in listed], numbers)
    tree.shown = len(listed)
    return tree


def _sessions(
    nodes: list[CallNode], numbers: dict[tuple[int, int], int]
) -> tuple[list[SessionView], list[CallNode]]:
    by_key = {(n.row.attempt, n.call): n for n in nodes}
    roots: list[CallNode] = []
    refused: list[CallNode] = []
    for node in nodes:
        row = node.row
        if row.session is None:
            refused.append(node)
            continue
        parent = by_key.get((row.attempt, row.parent)) if row.parent is not None else None
        # A parent is always placed (and its step written) before its children, so the kept
        # prefix holds it; a dangling one (a hand-edited trace) makes its child a root.
        if parent is not None and parent is not node:
            parent.children.append(node)
        else:
            roots.append(node)
    sessions: dict[tuple[int, int], list[CallNode]] = {}
    for root in roots:
        sessions.setdefault((root.row.attempt, root.row.session or 0), []).append(root)
    views = []
    for (attempt, session), session_roots in sessions.items():
        lines = [line for root in session_roots for line in _lines(root)]
        views.append(
            SessionView(
                attempt=attempt,
                number=numbers.get((attempt, session), 0),
                root=session,
                calls=sum(len(line.calls) for line in lines),
                lines=lines,
            )
        )
    views.sort(key=lambda view: (view.attempt, view.number))
    return views, refused


def _lines(root: CallNode) -> list[TreeLine]:
    """Depth first, without recursion: a branch may nest as deep as the calls go."""
    lines = []
    stack: list[tuple[CallNode, int, CallNode | None]] = [(root, 0, None)]
    while stack:
        node, depth, parent = stack.pop()
        chain = [node]
        while True:
            follow = next((c for c in chain[-1].children if c.relation == "continues"), None)
            if follow is None:
                break
            chain.append(follow)
        lines.append(TreeLine(depth=depth, calls=chain, parent=parent))
        forks = [
            (child, 1 + depth, at)
            for position, at in enumerate(chain)
            for child in at.children
            if position + 1 == len(chain) or child is not chain[position + 1]
        ]
        stack.extend(reversed(forks))
    return lines
