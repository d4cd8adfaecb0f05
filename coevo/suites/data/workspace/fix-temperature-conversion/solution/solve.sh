#!/bin/bash
set -e
sed -i 's|celsius \* 9 / 5 - 32|celsius * 9 / 5 + 32|' /app/temperature.py
