import pytest

from intervals import merge_intervals

CASES = [
    ('empty', [], []),
    ('single', [(1, 2)], [(1, 2)]),
    ('sorted_disjoint', [(1, 2), (4, 5)], [(1, 2), (4, 5)]),
    ('sorted_overlap', [(1, 3), (2, 6), (8, 10)], [(1, 6), (8, 10)]),
    ('unsorted', [(8, 10), (1, 3), (2, 6)], [(1, 6), (8, 10)]),
    ('touching', [(1, 3), (3, 5)], [(1, 5)]),
    ('nested', [(1, 10), (2, 3)], [(1, 10)]),
    ('nested_then_more', [(1, 10), (2, 3), (4, 12), (20, 21)], [(1, 12), (20, 21)]),
    ('duplicates', [(2, 4), (2, 4), (2, 4)], [(2, 4)]),
    ('negative', [(-5, -1), (-3, 2), (3, 4)], [(-5, 2), (3, 4)]),
    ('points', [(5, 5), (1, 1), (1, 2)], [(1, 2), (5, 5)]),
    ('all_merge_unsorted', [(7, 9), (1, 4), (3, 8), (0, 1)], [(0, 9)]),
]


@pytest.mark.parametrize("name,given,expected", CASES, ids=[c[0] for c in CASES])
def test_merge(name, given, expected):
    assert merge_intervals(list(given)) == expected


def test_lists_in_tuples_out():
    assert merge_intervals([[4, 6], [1, 5]]) == [(1, 6)]
    assert all(type(x) is tuple for x in merge_intervals([[4, 6], [1, 5], [9, 9]]))


def test_input_not_modified():
    data = [(8, 10), (1, 3), (2, 6)]
    merge_intervals(data)
    assert data == [(8, 10), (1, 3), (2, 6)]


def test_generator_input():
    assert merge_intervals(x for x in [(3, 4), (1, 2)]) == [(1, 2), (3, 4)]
