import itertools

import pytest

from semver import compare, sort_versions

CHAIN = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
         "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
LESS = [
    ("1.9.0", "1.10.0"), ("1.99.99", "2.0.0"), ("0.0.1", "0.1.0"),
    ("1.0.0-alpha.9", "1.0.0-alpha.10"), ("1.0.0-1", "1.0.0-a"),
    ("1.0.0-Z", "1.0.0-a"), ("1.0.0-a-b", "1.0.0-a-c"), ("1.0.0-rc.1+build.5", "1.0.0"),
    ("1.2.3-99999", "1.2.3-alpha"), ("2.0.0-rc.1", "2.0.0"),
]
EQUAL = [("1.0.0+build.1", "1.0.0"), ("1.0.0+a", "1.0.0+b"),
         ("1.0.0-rc.1+x", "1.0.0-rc.1"), ("3.2.1", "3.2.1")]
INVALID = ["", "1.2", "1.2.x", "a.b.c", "1.0.0-", "1.0.0-alpha..1", "1.2.3.4", "v1.2.3"]


@pytest.mark.parametrize("i,j", list(itertools.combinations(range(len(CHAIN)), 2)))
def test_semver_spec_chain(i, j):
    assert compare(CHAIN[i], CHAIN[j]) == -1
    assert compare(CHAIN[j], CHAIN[i]) == 1


@pytest.mark.parametrize("a,b", LESS)
def test_less(a, b):
    assert compare(a, b) == -1
    assert compare(b, a) == 1


@pytest.mark.parametrize("a,b", EQUAL)
def test_equal(a, b):
    assert compare(a, b) == 0
    assert compare(b, a) == 0


@pytest.mark.parametrize("bad", INVALID)
def test_invalid(bad):
    with pytest.raises(ValueError):
        compare(bad, "1.0.0")
    with pytest.raises(ValueError):
        compare("1.0.0", bad)


def test_sort_versions():
    shuffled = [CHAIN[i] for i in (7, 2, 5, 0, 6, 3, 1, 4)]
    before = list(shuffled)
    assert sort_versions(shuffled) == CHAIN
    assert shuffled == before


def test_sort_stable():
    assert sort_versions(["1.0.0+b", "0.1.0", "1.0.0+a"]) == ["0.1.0", "1.0.0+b", "1.0.0+a"]
    assert sort_versions([]) == []
