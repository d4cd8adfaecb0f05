#!/bin/bash
set -e
sed -i 's/Helo, /Hello, /' /app/greet.py
