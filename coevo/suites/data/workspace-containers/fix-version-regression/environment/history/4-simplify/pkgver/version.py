"""Release versions: MAJOR.MINOR.PATCH, an optional leading "v" and "-suffix"."""


def parse_version(text):
    """(major, minor, patch) of a version string; a pre-release suffix is ignored."""
    core = text.strip().removeprefix("v").split("-", 1)[0]
    parts = core.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in parts)


def _core(text):
    return text.strip().removeprefix("v").split("-", 1)[0]


def is_newer(candidate, current):
    """Whether release ``candidate`` is newer than ``current``."""
    # No need to build tuples: the cores are compared directly.
    return _core(candidate) > _core(current)
