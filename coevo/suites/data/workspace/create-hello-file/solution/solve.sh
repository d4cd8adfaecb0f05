#!/bin/bash
set -e
printf 'hello world\n' > /app/hello.txt
