#!/bin/bash
# Hidden verifier: reward 1 iff every hidden test passes, else 0.
export PYTHONDONTWRITEBYTECODE=1
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if python -m pytest -q -p no:cacheprovider /tests/test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
