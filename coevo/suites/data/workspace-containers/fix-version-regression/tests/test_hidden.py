"""Hidden tests: is_newer fixed, and the fix committed on top of the history the image's RUN
step made (its commits' ids are fixed: environment/history/commit.sh)."""

import subprocess
import sys
import unittest

PROJECT = "/app/project"
# The last commit commit.sh makes: the history the fix must build on, unchanged.
ORIGINAL_HEAD = "b1545cc04caf8c6443f3119137749b9780be212f"

sys.path.insert(0, PROJECT)


def git(*args):
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", PROJECT, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.returncode, proc.stdout.strip()


class IsNewer(unittest.TestCase):
    def test_regression(self):
        from pkgver import is_newer

        self.assertTrue(is_newer("1.10.0", "1.9.0"))
        self.assertFalse(is_newer("1.9.0", "1.10.0"))
        self.assertTrue(is_newer("10.0.0", "9.99.99"))
        self.assertTrue(is_newer("v2.0.10-rc1", "2.0.9"))

    def test_as_before(self):
        from pkgver import is_newer

        self.assertTrue(is_newer("1.4.3", "1.4.2"))
        self.assertFalse(is_newer("v1.4.2", "1.4.2"))
        self.assertFalse(is_newer("1.4.2-rc2", "1.4.2"))
        self.assertFalse(is_newer("0.9.0", "1.0.0"))

    def test_parse_version_unchanged(self):
        from pkgver import parse_version

        self.assertEqual(parse_version("v12.0.3-beta"), (12, 0, 3))
        with self.assertRaises(ValueError):
            parse_version("1.2")


class History(unittest.TestCase):
    def test_the_fix_is_a_new_commit_on_main(self):
        self.assertEqual(git("symbolic-ref", "--short", "HEAD"), (0, "main"))
        code, head = git("rev-parse", "HEAD")
        self.assertEqual(code, 0)
        self.assertNotEqual(head, ORIGINAL_HEAD, "nothing was committed")

    def test_the_history_is_not_rewritten(self):
        code, _ = git("merge-base", "--is-ancestor", ORIGINAL_HEAD, "HEAD")
        self.assertEqual(code, 0, "the original commits are no longer in main's history")

    def test_the_fix_and_its_test_are_committed(self):
        code, changed = git("diff", "--name-only", ORIGINAL_HEAD, "HEAD")
        self.assertEqual(code, 0)
        self.assertIn("pkgver/version.py", changed.split())
        self.assertIn("tests/test_version.py", changed.split())

    def test_the_working_tree_is_clean(self):
        self.assertEqual(git("status", "--porcelain"), (0, ""))

    def test_the_projects_tests_pass(self):
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "discover", "-s", "tests", "-t", "."],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
