#!/bin/bash
set -e
cd /app
sed -i 's/\bcalc\b/calculate_total/g' utils.py cart.py report.py
