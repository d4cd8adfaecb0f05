from semver import compare, sort_versions


def test_basic():
    assert compare("1.0.0", "2.0.0") == -1
    assert compare("1.0.0-alpha", "1.0.0") == -1


def test_sort():
    assert sort_versions(["1.0.0", "0.9.0"]) == ["0.9.0", "1.0.0"]
