#!/bin/bash
set -e
cat > /app/linecount.sh <<'EOF'
#!/bin/bash
# Usage: linecount.sh DIR -- total lines in all *.txt files under DIR.
find "$1" -type f -name '*.txt' -exec cat {} + | wc -l | tr -d ' '
EOF
chmod +x /app/linecount.sh
