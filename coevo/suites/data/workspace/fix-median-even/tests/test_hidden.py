import pytest

from stats import mean, median


def test_even():
    assert median([4, 1, 3, 2]) == 2.5
    assert median([1, 2]) == 1.5
    assert median([-5, -1]) == -3
    assert median([1.5, 2.5, 10, 0]) == pytest.approx(2.0)
    assert median((7, 7, 7, 7)) == 7


def test_odd():
    assert median([5]) == 5
    assert median([9, 1, 5]) == 5
    assert median((3, -2, 8, 0, 1)) == 1


def test_not_mutated():
    data = [4, 1, 3, 2]
    median(data)
    assert data == [4, 1, 3, 2]


def test_empty():
    with pytest.raises(ValueError):
        median([])
    with pytest.raises(ValueError):
        mean([])
    assert mean([1, 2]) == 1.5
