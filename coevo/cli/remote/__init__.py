"""``coevo submit``, ``coevo evaluate``, ``coevo gate`` and ``coevo promote``: the CI side of
coevo, one module per command (shared polling and printing in :mod:`.common`).

They talk to a coevo server's REST API (docs/api.md) through :mod:`coevo.cli.client` and run
the user's ``git`` through :mod:`coevo.cli.gitlocal`; nothing here imports Django, so a CI
runner needs only the HTTP client.

Output: results on stdout (``--json`` prints the API object and nothing else there), progress,
warnings and errors on stderr as ``coevo: <message> (<code>)``.

Exit codes (docs/ci.md):

- ``submit``, ``evaluate``, ``promote``: 0 done, 1 error (or, for ``evaluate --wait``, a failed or
  cancelled evaluation, or ``--timeout``); argparse's usage errors stay 2.
- ``gate``: 0 pass, 1 fail, 2 inconclusive, 3 error (an API or connection error, a gate that
  ended in error, ``--timeout``, and usage errors too: a mistyped flag in a CI script must not
  read as "inconclusive"). Without ``--wait``: 0 once the gate is created, 3 on error.
"""

from __future__ import annotations

from typing import Any

from coevo.cli.remote import evaluate, gate, promote, submit
from coevo.cli.remote.gate import gate_exit_code
from coevo.cli.remote.submit import candidate_submit

__all__ = ["candidate_submit", "gate_exit_code", "register"]


def register(commands: Any) -> None:
    for command in (submit, evaluate, gate, promote):
        command.register(commands)
