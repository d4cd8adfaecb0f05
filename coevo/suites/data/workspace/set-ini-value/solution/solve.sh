#!/bin/bash
set -e
sed -i '/^\[database\]/,/^\[/ s/^host = localhost$/host = db.internal/' /app/app.ini
