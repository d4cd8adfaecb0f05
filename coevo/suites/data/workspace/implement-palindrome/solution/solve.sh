#!/bin/bash
set -e
cat > /app/palindrome.py <<'EOF'
def is_palindrome(text):
    """True if `text` is a palindrome, ignoring case and every
    character that is not a letter or digit. "" is a palindrome."""
    chars = [c.lower() for c in text if c.isalnum()]
    return chars == chars[::-1]
EOF
