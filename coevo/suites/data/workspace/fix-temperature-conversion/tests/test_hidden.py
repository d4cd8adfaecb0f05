import pytest

from temperature import c_to_f, f_to_c


def test_known_points():
    assert c_to_f(0) == 32
    assert c_to_f(100) == 212
    assert c_to_f(-40) == -40
    assert c_to_f(37) == pytest.approx(98.6)


def test_round_trip():
    for c in range(-50, 150, 7):
        assert f_to_c(c_to_f(c)) == pytest.approx(c)
