#!/bin/bash
set -e
cat > /app/toposort.py <<'EOF'
"""Dependency ordering."""
import heapq


class CycleError(ValueError):
    """Raised when the dependencies contain a cycle."""


def topo_sort(deps):
    """Kahn's algorithm with a min-heap of ready tasks."""
    needs = {}
    users = {}
    for task, reqs in deps.items():
        needs.setdefault(task, set())
        for req in reqs:
            needs[task].add(req)
            needs.setdefault(req, set())
    for task, reqs in needs.items():
        for req in reqs:
            users.setdefault(req, []).append(task)
    remaining = {task: len(reqs) for task, reqs in needs.items()}
    ready = [task for task, count in remaining.items() if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        task = heapq.heappop(ready)
        order.append(task)
        for user in users.get(task, ()):
            remaining[user] -= 1
            if remaining[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(needs):
        raise CycleError("dependency cycle")
    return order
EOF
