import unittest

from pkgver import is_newer, parse_version


class ParseVersion(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(parse_version("1.4.2"), (1, 4, 2))

    def test_prefix_and_suffix(self):
        self.assertEqual(parse_version("v2.0.0-rc1"), (2, 0, 0))

    def test_rejects_garbage(self):
        with self.assertRaises(ValueError):
            parse_version("1.4")


class IsNewer(unittest.TestCase):
    def test_patch(self):
        self.assertTrue(is_newer("1.4.3", "1.4.2"))

    def test_same(self):
        self.assertFalse(is_newer("v1.4.2", "1.4.2"))
