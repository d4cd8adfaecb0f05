#!/bin/bash
# Replays pkgver's history into the new repository $1, one step's files a commit. Names and
# dates are fixed, so the commits' ids are the same in every build (the tests name them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$1"
export GIT_AUTHOR_NAME="Dana Whitfield" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Whitfield" GIT_COMMITTER_EMAIL="dana@example.com"

step() {  # step DIR EPOCH-SECONDS MESSAGE
  cp -R "$here/$1/." .
  git add -A
  GIT_AUTHOR_DATE="$2 +0000" GIT_COMMITTER_DATE="$2 +0000" git commit -q -m "$3"
}

# Written here rather than shipped: a dotfile would not travel as package data.
printf '__pycache__/\n*.pyc\n' > .gitignore
step 1-import 1772445600 "Import pkgver: parse_version"
step 2-tests 1772532000 "Add tests for parse_version"
step 3-is-newer 1772618400 "Add is_newer to compare releases"
step 4-simplify 1772791200 "Simplify is_newer: compare the version cores directly"
