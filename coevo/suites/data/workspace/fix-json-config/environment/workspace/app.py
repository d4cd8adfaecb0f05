"""Loads config/settings.json."""
import json
from pathlib import Path

SETTINGS_PATH = Path(__file__).parent / "config" / "settings.json"


def load_settings():
    return json.loads(SETTINGS_PATH.read_text())


if __name__ == "__main__":
    s = load_settings()
    print("starting %s on %s:%d" % (s["app_name"], s["host"], s["port"]))
