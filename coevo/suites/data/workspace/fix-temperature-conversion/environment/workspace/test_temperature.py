from temperature import c_to_f, f_to_c


def test_boiling_point():
    assert c_to_f(100) == 212
    assert f_to_c(212) == 100
