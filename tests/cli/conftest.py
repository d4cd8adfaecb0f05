"""Fixtures for the remote commands: real git repositories made with the git CLI, and a real
HTTP server (a thread of this process) that answers with scripted API replies."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

TOKEN = "coevo_abcdefgh_s3cr3t-never-printed"


def run_git(repo: Path, *args: str) -> str:
    completed = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={
            "GIT_AUTHOR_NAME": "Dev",
            "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_NAME": "Dev",
            "GIT_COMMITTER_EMAIL": "dev@example.com",
            "HOME": str(repo.parent),
            "PATH": "/usr/bin:/bin",
            "GIT_CONFIG_NOSYSTEM": "1",
        },
    )
    return completed.stdout.strip()


def commit_file(repo: Path, name: str, text: str, message: str) -> str:
    (repo / name).write_text(text)
    run_git(repo, "add", name)
    run_git(repo, "commit", "-q", "-m", message)
    return run_git(repo, "rev-parse", "HEAD")


@dataclass
class History:
    """root ─ a1 ─ a2 ─ merge      (merge's parents: a2 and b1)
    └── b1 ──────┘"""

    repo: Path
    root: str
    a1: str
    a2: str
    b1: str
    merge: str


@pytest.fixture
def history(tmp_path) -> History:
    repo = tmp_path / "harness"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    root = commit_file(repo, "agent.py", "def run(task, ctx):\n    return ''\n", "root")
    a1 = commit_file(repo, "a.txt", "a1\n", "a1")
    a2 = commit_file(repo, "a.txt", "a2\n", "a2")
    run_git(repo, "checkout", "-q", "-b", "side", root)
    b1 = commit_file(repo, "b.txt", "b1\n", "b1")
    run_git(repo, "checkout", "-q", "main")
    run_git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = run_git(repo, "rev-parse", "HEAD")
    return History(repo=repo, root=root, a1=a1, a2=a2, b1=b1, merge=merge)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, bytes]:
        """The multipart fields, by name."""
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode() + self.body
        )
        return {
            part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in message.iter_parts()
        }


@dataclass
class ScriptedApi:
    """Replies by (method, path): a list of (status, body, headers); the last one repeats."""

    url: str = ""
    routes: dict[tuple[str, str], list[tuple[int, Any, dict[str, str]]]] = field(
        default_factory=dict
    )
    requests: list[Recorded] = field(default_factory=list)

    def on(self, method: str, path: str, *replies: tuple[int, Any] | tuple[int, Any, dict]) -> None:
        self.routes[(method, path)] = [(*reply, {})[:3] for reply in replies]

    def calls(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]


class _Handler(BaseHTTPRequestHandler):
    api: ScriptedApi

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self.api.requests.append(
            Recorded(
                method=self.command,
                path=path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        replies = self.api.routes.get((self.command, path))
        if not replies:
            status, payload, headers = 404, {"error": {"code": "not_found", "message": path}}, {}
        else:
            status, payload, headers = replies.pop(0) if len(replies) > 1 else replies[0]
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/html" if isinstance(payload, bytes) else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _reply

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api(monkeypatch) -> ScriptedApi:
    scripted = ScriptedApi()
    handler = type("Handler", (_Handler,), {"api": scripted})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    scripted.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("COEVO_URL", scripted.url)
    monkeypatch.setenv("COEVO_TOKEN", TOKEN)
    monkeypatch.setenv("COEVO_PROJECT", "demo")
    # Retries and polling without the waits.
    monkeypatch.setattr("coevo.cli.client.sleep", lambda seconds: None)
    monkeypatch.setattr("coevo.cli.remote.common.sleep", lambda seconds: None)
    yield scripted
    server.shutdown()
    server.server_close()
    thread.join()
