from inventory import Item, format_cents, low_stock, total_value_cents

ITEMS = [
    Item("Z-9", "gear", 1999, 5),
    Item("A-1", "bolt", 25, 100),
    Item("M-4", "spring", 150, 6),
    Item("B-2", "nut", 10, 2),
]


def test_total_value():
    assert total_value_cents(ITEMS) == 1999 * 5 + 25 * 100 + 150 * 6 + 10 * 2
    assert total_value_cents([]) == 0


def test_low_stock_threshold_inclusive_and_sorted():
    assert low_stock(ITEMS) == ["B-2", "Z-9"]
    assert low_stock(ITEMS, threshold=6) == ["B-2", "M-4", "Z-9"]
    assert low_stock(ITEMS, threshold=1) == []
    assert low_stock([]) == []


def test_format_cents():
    assert format_cents(1205) == "$12.05"
    assert format_cents(5) == "$0.05"
    assert format_cents(0) == "$0.00"
    assert format_cents(100000) == "$1000.00"
    assert format_cents(-150) == "-$1.50"
    assert format_cents(-5) == "-$0.05"
    assert format_cents(99) == "$0.99"
