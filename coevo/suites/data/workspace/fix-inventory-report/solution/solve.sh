#!/bin/bash
set -e
cat > /app/inventory/report.py <<'EOF'
"""Reports over lists of inventory.Item."""


def total_value_cents(items):
    """Total stock value in cents: the sum of unit_price_cents * quantity."""
    return sum(item.unit_price_cents * item.quantity for item in items)


def low_stock(items, threshold=5):
    """SKUs of the items whose quantity is at or below `threshold`,
    sorted by SKU."""
    return sorted(item.sku for item in items if item.quantity <= threshold)


def format_cents(cents):
    """Format an amount in cents as dollars with exactly two decimals:
    1205 -> "$12.05", 5 -> "$0.05", 0 -> "$0.00", -150 -> "-$1.50"."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}${cents // 100}.{cents % 100:02d}"
EOF
