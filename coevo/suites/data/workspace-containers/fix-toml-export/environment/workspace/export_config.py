"""Convert the service's JSON settings into the TOML file the deploy tool reads.

Usage: python3 export_config.py SETTINGS.json OUT.toml
"""

import json
import sys

import tomli_w


def toml_ready(value):
    """``value`` as TOML can hold it: TOML has no null, so null settings are left out."""
    if isinstance(value, dict):
        return {key: toml_ready(item) for key, item in value.items() if item is not None}
    return value


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    source, target = argv[1], argv[2]
    with open(source) as f:
        settings = json.load(f)
    with open(target, "w") as f:
        tomli_w.dump(toml_ready(settings), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
