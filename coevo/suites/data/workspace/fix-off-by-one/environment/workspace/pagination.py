"""Split a list into pages."""


def paginate(items, page, per_page=10):
    """Return the items on 1-based page number `page`.

    Page 1 holds items[0:per_page], page 2 the next per_page items,
    and so on. Pages past the end are empty lists.
    Raise ValueError if page < 1.
    """
    if page < 1:
        raise ValueError("page must be >= 1")
    start = page * per_page
    return items[start:start + per_page]


def page_count(items, per_page=10):
    """Number of non-empty pages."""
    return (len(items) + per_page - 1) // per_page
