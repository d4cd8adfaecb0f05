from pagination import page_count, paginate


def test_first_page():
    assert paginate(list(range(25)), 1) == list(range(10))


def test_page_count():
    assert page_count(list(range(25))) == 3
