#!/bin/bash
set -e
cat > /app/summarize.py <<'EOF'
"""Usage: python summarize.py INPUT_CSV OUTPUT_JSON"""
import csv
import json
import sys


def summarize(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    revenue_by_region = {}
    units_by_product = {}
    total_units = 0
    total_revenue = 0.0
    for row in rows:
        units = int(row["units"])
        revenue = units * float(row["unit_price"])
        total_units += units
        total_revenue += revenue
        revenue_by_region[row["region"]] = revenue_by_region.get(row["region"], 0.0) + revenue
        units_by_product[row["product"]] = units_by_product.get(row["product"], 0) + units
    top = None
    if units_by_product:
        top = min(units_by_product, key=lambda p: (-units_by_product[p], p))
    return {
        "rows": len(rows),
        "total_units": total_units,
        "total_revenue": round(total_revenue, 2),
        "revenue_by_region": {k: round(v, 2) for k, v in sorted(revenue_by_region.items())},
        "top_product": top,
    }


if __name__ == "__main__":
    with open(sys.argv[2], "w") as f:
        json.dump(summarize(sys.argv[1]), f, indent=2)
EOF
cd /app && python summarize.py sales.csv summary.json
