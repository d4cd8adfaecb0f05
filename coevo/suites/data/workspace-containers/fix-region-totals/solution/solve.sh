#!/bin/bash
# Group after sorting by region (datamash -s), and sum amount_cents (column 5), not quantity.
set -euo pipefail
cd /app
sed -i 's/datamash -g 2 count 2 sum 4/datamash -s -g 2 count 2 sum 5/' bin/region_totals.sh
grep -q 'datamash -s -g 2 count 2 sum 5' bin/region_totals.sh
