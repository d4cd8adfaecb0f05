"""Diffs between candidates (and from a commit to a merge's tree), as text or one part per
file, checked against git's own list of changed files and bounded in size and time. The
reader of the text is :mod:`harness_store.diffs`."""

from __future__ import annotations

from harness_store.diffs import NAME_ERRORS, DiffTooLarge, DiffUnreadable, FilePatch, diff_parse
from harness_store.repo_base import DEFAULT_GIT_TIMEOUT_S, EMPTY_TREE, GitTimedOut, RepoBase

# What a diff may hold by default: the web pages read it whole.
DEFAULT_MAX_DIFF_BYTES = 5 * 1024 * 1024
# Options every diff is made with, whatever the server's git configuration says: the reader in
# harness_store.diffs expects exactly this format (a/ b/ prefixes, C-quoted names, a space before
# empty context lines, no colour, no drivers that rewrite content, submodules as one line).
_DIFF_CONFIG = ("-c", "core.quotePath=true", "-c", "diff.suppressBlankEmpty=false")
_DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--find-renames",
    "--submodule=short",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


class DiffMethods(RepoBase):
    """The diff part of :class:`harness_store.repo.HarnessRepo`."""

    def diff(
        self,
        base_sha: str | None,
        head_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> str:
        """Unified diff from base to head (base None: against the empty tree).

        Raises DiffTooLarge when git's output passes ``max_bytes``: git is stopped there, so a
        diff of a huge file never sits whole in the caller's memory.
        """
        base, head = self._diff_ends(base_sha, head_sha)
        return self._diff_text(base, head, context=context, max_bytes=max_bytes)

    def diff_to_tree(
        self,
        base_sha: str,
        tree_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> str:
        """Unified diff from a commit to a tree (what a merge would change on its first parent);
        DiffTooLarge past ``max_bytes``."""
        base = self._commit(base_sha).hexsha
        return self._diff_text(base, tree_sha, context=context, max_bytes=max_bytes)

    def diff_files(
        self,
        base_sha: str | None,
        head_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> list[FilePatch]:
        """The diff from base to head, one part per file, checked against git's own list of
        the changed files: DiffUnreadable when a file git lists is not in the parts (a reader
        must never be shown fewer files than changed), DiffTooLarge as :meth:`diff`."""
        base, head = self._diff_ends(base_sha, head_sha)
        parts = diff_parse(self._diff_output(base, head, context=context, max_bytes=max_bytes))
        listed = set(self._diff_names(base, head))
        shown = {name for part in parts for name in (part.old_path, part.new_path) if name}
        if listed != shown:
            missing = sorted(listed - shown) or sorted(shown - listed)
            raise DiffUnreadable(
                f"The diff does not account for {', '.join(repr(n) for n in missing[:5])}; it is "
                "not shown rather than shown without some of its files."
            )
        return parts

    def diff_names(self, base_sha: str | None, head_sha: str) -> list[str]:
        """Every path the diff from base to head touches (both names of a rename), unquoted.

        Git's NUL-separated list, which holds any name as it is (tabs, newlines, quotes).
        """
        return self._diff_names(*self._diff_ends(base_sha, head_sha))

    def _diff_names(self, base: str, head: str) -> list[str]:
        out, complete = self._git_bounded(
            [*_DIFF_CONFIG, "diff", "--name-status", "-z", *_DIFF_OPTIONS, base, head, "--"],
            max_bytes=DEFAULT_MAX_DIFF_BYTES,
        )
        if not complete:
            raise DiffTooLarge(
                f"The list of changed files is longer than {DEFAULT_MAX_DIFF_BYTES} bytes; "
                "compare candidates that are closer to each other."
            )
        fields = out.split(b"\0")
        if fields and fields[-1] == b"":
            fields.pop()
        names: list[str] = []
        i = 0
        while i < len(fields):
            # "M\0path", or "R086\0old\0new" for a rename or copy.
            status, count = fields[i], 2 if fields[i][:1] in (b"R", b"C") else 1
            if not status or i + count >= len(fields):
                raise DiffUnreadable("git's list of changed files is cut short.")
            names += [name.decode("utf-8", NAME_ERRORS) for name in fields[i + 1 : i + 1 + count]]
            i += 1 + count
        return names

    def _diff_text(self, base: str, head: str, *, context: int, max_bytes: int) -> str:
        # As GitPython returned it before: one trailing newline dropped; bytes that are not UTF-8
        # (a Latin-1 file) shown as U+FFFD rather than failing the page or the JSON encoder.
        output = self._diff_output(base, head, context=context, max_bytes=max_bytes)
        return output.removesuffix(b"\n").decode("utf-8", "replace")

    def _diff_ends(self, base_sha: str | None, head_sha: str) -> tuple[str, str]:
        head = self._commit(head_sha).hexsha
        base = self._commit(base_sha).hexsha if base_sha else EMPTY_TREE
        return base, head

    def _diff_output(self, base: str, head: str, *, context: int, max_bytes: int) -> bytes:
        args = [*_DIFF_CONFIG, "diff", f"-U{int(context)}", *_DIFF_OPTIONS, base, head, "--"]
        try:
            out, complete = self._git_bounded(args, max_bytes=max_bytes)
        except GitTimedOut:
            raise DiffTooLarge(
                f"git took more than {DEFAULT_GIT_TIMEOUT_S:.0f} s to write this diff: it is too "
                "large to show. Compare candidates that are closer to each other, or read the "
                "changed files one by one."
            ) from None
        if not complete:
            raise DiffTooLarge(
                f"The diff is larger than {max_bytes} bytes: too large to show. Compare "
                "candidates that are closer to each other, or read the changed files one by one."
            )
        return out
