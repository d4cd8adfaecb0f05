import re
from pathlib import Path

import cart
import report
import utils


def test_new_name():
    assert utils.calculate_total([1.0, 2.0, 3.0]) == 6.0
    assert utils.calculate_total([10.0], 0.2) == 12.0
    assert utils.calculate_total([]) == 0


def test_old_name_gone():
    assert not hasattr(utils, "calc")
    assert not hasattr(cart, "calc")
    for path in Path("/app").rglob("*.py"):
        assert not re.search(r"\bcalc\b", path.read_text()), path


def test_callers():
    c = cart.Cart()
    c.add(2.5)
    c.add(7.5)
    assert c.total() == 10.0
    assert c.total(0.1) == 11.0
    assert report.summary_line([2.5, 7.5], 0.25) == "2 items, total 12.50"
