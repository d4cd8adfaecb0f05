#!/bin/bash
set -e
sed -i 's/^MAX_RETRIES = 3$/MAX_RETRIES = 5/' /app/config.py
