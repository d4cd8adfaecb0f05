#!/bin/bash
# Hidden verifier (binary): reward 1 when every hidden test passes, else 0. Offline: the
# image's python3 and its standard library only.
export PYTHONDONTWRITEBYTECODE=1
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app || exit 0
if python3 /tests/test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
fi
cat /logs/verifier/reward.txt
