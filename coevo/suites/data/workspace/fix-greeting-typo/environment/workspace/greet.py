"""Greetings."""


def greet(name):
    """Return a friendly greeting, e.g. greet("Ada") == "Hello, Ada!"."""
    return f"Helo, {name}!"


def greet_all(names):
    """Return one greeting per name, in order."""
    return [greet(n) for n in names]
