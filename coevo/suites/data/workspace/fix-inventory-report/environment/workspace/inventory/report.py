"""Reports over lists of inventory.Item."""


def total_value_cents(items):
    """Total stock value in cents: the sum of unit_price_cents * quantity."""
    return sum(item.unit_price_cents for item in items)


def low_stock(items, threshold=5):
    """SKUs of the items whose quantity is at or below `threshold`,
    sorted by SKU."""
    return [item.sku for item in items if item.quantity < threshold]


def format_cents(cents):
    """Format an amount in cents as dollars with exactly two decimals:
    1205 -> "$12.05", 5 -> "$0.05", 0 -> "$0.00", -150 -> "-$1.50"."""
    return f"${cents // 100}.{cents % 100}"
