import pytest

from pagination import page_count, paginate

ITEMS = list(range(25))


def test_pages():
    assert paginate(ITEMS, 1) == list(range(10))
    assert paginate(ITEMS, 2) == list(range(10, 20))
    assert paginate(ITEMS, 3) == list(range(20, 25))
    assert paginate(ITEMS, 4) == []


def test_per_page():
    assert paginate(ITEMS, 2, per_page=7) == list(range(7, 14))
    assert paginate(list("abc"), 1, per_page=2) == ["a", "b"]
    assert paginate(list("abc"), 2, per_page=2) == ["c"]
    assert paginate([], 1) == []


def test_invalid_page():
    with pytest.raises(ValueError):
        paginate(ITEMS, 0)
    with pytest.raises(ValueError):
        paginate(ITEMS, -1)


def test_page_count():
    assert page_count([]) == 0
    assert page_count(list(range(20))) == 2
    assert page_count(list(range(21)), per_page=7) == 3
