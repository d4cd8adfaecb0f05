#!/bin/bash
# Hidden verifier (graded): reward = fraction of hidden tests that pass.
export PYTHONDONTWRITEBYTECODE=1
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app || exit 0
python -m pytest -q -p no:cacheprovider --junitxml=/tmp/hidden-junit.xml /tests/test_hidden.py
python /tests/grade.py /tmp/hidden-junit.xml > /tmp/reward.txt && cp /tmp/reward.txt /logs/verifier/reward.txt
cat /logs/verifier/reward.txt
