import copy

import pytest

from toposort import CycleError, topo_sort

CASES = [
    ("empty", {}, []),
    ("single", {"x": []}, ["x"]),
    ("chain", {"c": ["b"], "b": ["a"]}, ["a", "b", "c"]),
    ("diamond", {"d": ["b", "c"], "b": ["a"], "c": ["a"]}, ["a", "b", "c", "d"]),
    ("ready_smallest", {"z": [], "y": [], "a": ["z"]}, ["y", "z", "a"]),
    ("interleave", {"b": ["c"], "a": ["d"], "c": [], "d": []}, ["c", "b", "d", "a"]),
    ("dep_only_names", {"app": ["lib", "utils"]}, ["lib", "utils", "app"]),
    ("sets_and_tuples", {"t": {"s", "r"}, "s": ("r",)}, ["r", "s", "t"]),
    ("duplicate_deps", {"b": ["a", "a"]}, ["a", "b"]),
]


@pytest.mark.parametrize("name,deps,expected", CASES, ids=[c[0] for c in CASES])
def test_order(name, deps, expected):
    assert topo_sort(deps) == expected


@pytest.mark.parametrize("deps", [
    {"a": ["a"]},
    {"a": ["b"], "b": ["c"], "c": ["a"]},
    {"x": [], "a": ["b"], "b": ["a"], "z": ["x"]},
])
def test_cycles(deps):
    with pytest.raises(CycleError):
        topo_sort(deps)


def test_cycle_error_is_value_error():
    assert issubclass(CycleError, ValueError)


def test_not_modified():
    deps = {"d": ["b", "c"], "b": ["a"], "c": ["a"]}
    before = copy.deepcopy(deps)
    topo_sort(deps)
    assert deps == before


def test_long_chain():
    n = 3000
    deps = {"n%05d" % i: ["n%05d" % (i - 1)] for i in range(1, n)}
    assert topo_sort(deps) == ["n%05d" % i for i in range(n)]


def test_reverse_names_chain():
    deps = {"a": ["b"], "b": ["c"], "c": ["d"]}
    assert topo_sort(deps) == ["d", "c", "b", "a"]
