from pkgver.version import is_newer, parse_version

__all__ = ["is_newer", "parse_version"]
