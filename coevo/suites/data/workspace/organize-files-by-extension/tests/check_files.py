"""Graded file-layout check: prints the fraction of checks passed."""
import os

INBOX = {
    "notes.txt": "meeting notes: ship on friday\n",
    "TODO.TXT": "- write tests\n- fix bug\n",
    "old.backup.csv": "region,total\nsouth,3\n",
    "guide.md": "# Guide\n\nRead me first.\n",
    "server.log": "INFO started\nWARN disk 91%\n",
    "Makefile": "all:\n\techo build\n"
}
DEST = {
    "notes.txt": "txt",
    "TODO.TXT": "txt",
    "old.backup.csv": "csv",
    "guide.md": "md",
    "server.log": "log",
    "Makefile": "other"
}


def checks():
    results = []
    for name, text in INBOX.items():
        path = os.path.join("/app/sorted", DEST[name], name)
        try:
            with open(path, newline="") as f:
                results.append(f.read() == text)
        except OSError:
            results.append(False)
    leftover = []
    if os.path.isdir("/app/inbox"):
        for root, _dirs, files in os.walk("/app/inbox"):
            leftover.extend(files)
    results.append(os.path.isdir("/app/sorted") and not leftover)
    found = set()
    for root, _dirs, files in os.walk("/app/sorted"):
        for fn in files:
            found.add(os.path.relpath(os.path.join(root, fn), "/app/sorted"))
    expected = {os.path.join(DEST[n], n) for n in INBOX}
    results.append(found == expected)
    return results


if __name__ == "__main__":
    r = checks()
    print("%.4f" % (sum(r) / len(r)))
