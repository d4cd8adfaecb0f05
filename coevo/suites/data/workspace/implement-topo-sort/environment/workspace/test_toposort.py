import pytest

from toposort import CycleError, topo_sort


def test_simple():
    assert topo_sort({"b": ["a"], "a": []}) == ["a", "b"]


def test_cycle():
    with pytest.raises(CycleError):
        topo_sort({"a": ["b"], "b": ["a"]})
