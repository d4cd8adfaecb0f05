import random
from collections import OrderedDict

import pytest

from lru import LRUCache


def test_get_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert "a" in c and "c" in c and "b" not in c


def test_put_update_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert "b" not in c
    assert c.get("a") == 10
    assert c.get("c") == 3


def test_contains_does_not_refresh():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert "a" in c
    c.put("c", 3)
    assert "a" not in c
    assert len(c) == 2


def test_missing_and_capacity_one():
    c = LRUCache(1)
    assert c.get("x") is None
    assert c.get("x", 5) == 5
    assert len(c) == 0
    c.put("x", 1)
    c.put("y", 2)
    assert "x" not in c and c.get("y") == 2
    with pytest.raises(ValueError):
        LRUCache(0)


def test_random_against_model():
    rng = random.Random(42)
    cap = 4
    c = LRUCache(cap)
    model = OrderedDict()
    for _ in range(3000):
        key = rng.randrange(8)
        if rng.random() < 0.5:
            value = rng.randrange(1000)
            c.put(key, value)
            model[key] = value
            model.move_to_end(key)
            if len(model) > cap:
                model.popitem(last=False)
        else:
            expected = model.get(key)
            if key in model:
                model.move_to_end(key)
            assert c.get(key) == expected
        assert len(c) == len(model)
        for k in range(8):
            assert (k in c) == (k in model)
