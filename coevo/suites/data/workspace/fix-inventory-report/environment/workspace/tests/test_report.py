from inventory import Item, format_cents, low_stock, total_value_cents

ITEMS = [
    Item("A-1", "bolt", 25, 100),
    Item("B-2", "nut", 10, 3),
    Item("C-3", "washer", 5, 0),
]


def test_total_value():
    assert total_value_cents(ITEMS) == 2530


def test_low_stock():
    assert low_stock(ITEMS) == ["B-2", "C-3"]


def test_format_cents():
    assert format_cents(1205) == "$12.05"
