from greet import greet, greet_all


def test_greet_names():
    assert greet("Ada") == "Hello, Ada!"
    assert greet("World") == "Hello, World!"
    assert greet("") == "Hello, !"


def test_greet_all():
    assert greet_all(["a", "b"]) == ["Hello, a!", "Hello, b!"]
    assert greet_all([]) == []
