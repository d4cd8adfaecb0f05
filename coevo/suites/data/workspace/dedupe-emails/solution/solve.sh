#!/bin/bash
set -e
cd /app
tr 'A-Z' 'a-z' < contacts.txt | sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep -v '^$' | LC_ALL=C sort -u > unique_emails.txt
