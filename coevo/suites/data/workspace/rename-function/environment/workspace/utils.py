"""Pricing helpers."""


def calc(prices, tax_rate=0.0):
    """Total of `prices` with tax applied, rounded to 2 decimals."""
    return round(sum(prices) * (1 + tax_rate), 2)
