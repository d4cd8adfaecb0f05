"""Hidden tests: the script's summary of exports it has not seen (standard library only)."""

import csv
import subprocess
import unittest
from collections import defaultdict
from pathlib import Path

SCRIPT = "/app/bin/region_totals.sh"
DATA = Path(__file__).parent / "data"


def expected(path):
    orders = defaultdict(int)
    revenue = defaultdict(int)
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            orders[row["region"]] += 1
            revenue[row["region"]] += int(row["amount_cents"])
    return "".join(f"{r}\t{orders[r]}\t{revenue[r]}\n" for r in sorted(orders))


def run(path):
    return subprocess.run(["bash", SCRIPT, str(path)], capture_output=True, text=True, timeout=30)


class RegionTotals(unittest.TestCase):
    def check(self, path):
        proc = run(path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, expected(path))

    def test_sample(self):
        self.check("/app/data/sales.tsv")

    def test_unsorted_month(self):
        self.check(DATA / "june.tsv")

    def test_one_row(self):
        self.check(DATA / "one-row.tsv")

    def test_header_only(self):
        proc = run(DATA / "empty.tsv")
        self.assertEqual((proc.returncode, proc.stdout), (0, ""), proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
