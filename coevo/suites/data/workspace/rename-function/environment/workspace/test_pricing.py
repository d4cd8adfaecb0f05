from cart import Cart
from utils import calculate_total


def test_calculate_total():
    assert calculate_total([1.0, 2.0], 0.5) == 4.5


def test_cart():
    c = Cart()
    c.add(10.0)
    assert c.total() == 10.0
