"""Turn a pytest junit XML report into a reward: passed / total (0 on any problem)."""
import sys
import xml.etree.ElementTree as ET


def main(path):
    try:
        root = ET.parse(path).getroot()
    except Exception:
        return 0.0
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = bad = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        for key in ("failures", "errors", "skipped"):
            bad += int(suite.get(key, 0))
    if total <= 0:
        return 0.0
    return max(0.0, min(1.0, (total - bad) / total))


if __name__ == "__main__":
    print("%.4f" % main(sys.argv[1]))
