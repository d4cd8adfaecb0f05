#!/bin/bash
# Orders and revenue per region from a sales export.
#
# Usage: region_totals.sh SALES.tsv
#
# SALES.tsv is tab-separated with a header line:
#   date  region  sku  quantity  amount_cents
# Prints one line per region, sorted by region name:
#   region<TAB>orders<TAB>revenue_cents
set -euo pipefail

tail -n +2 "$1" | datamash -g 2 count 2 sum 4
