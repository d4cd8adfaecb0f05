import utils


def summary_line(prices, tax_rate=0.0):
    """e.g. "3 items, total 12.50"."""
    return f"{len(prices)} items, total {utils.calc(prices, tax_rate):.2f}"
