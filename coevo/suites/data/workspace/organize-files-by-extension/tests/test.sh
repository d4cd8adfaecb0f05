#!/bin/bash
# Hidden verifier (graded): reward = fraction of file checks that pass.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app || exit 0
python /tests/check_files.py > /tmp/reward.txt && cp /tmp/reward.txt /logs/verifier/reward.txt
cat /logs/verifier/reward.txt
