#!/bin/bash
set -e
cat > /app/fizzbuzz.py <<'EOF'
def fizzbuzz(n):
    """Return a list of strings for the numbers 1..n."""
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
EOF
