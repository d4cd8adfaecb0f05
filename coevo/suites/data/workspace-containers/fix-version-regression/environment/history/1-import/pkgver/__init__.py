from pkgver.version import parse_version

__all__ = ["parse_version"]
