"""The escape suite, part two: hostile programs against the model boundary.

Each attack is a program harness (Python with the standard library, raw sockets where HTTP
clients would be too polite) run in the real sandbox through the real runner, against the real
worker-side boundary (workers/boundary.py) and the launcher's forwarder inside the sandbox,
with the scripted OpenAI server as the policy. The program reports what it could observe in
its answer; the test checks that the attack was contained, that an honest program rollout
running beside it on the same worker passed (the denial-of-service attacks), and that nothing
of one rollout reached another. After every test no sandbox, socket, boundary thread or pipe is
left, and an honest rollout passes.

Timeouts are the boundary's own constants, made short here (``IO_TIMEOUT_S``) so that each
test takes seconds. docs/threat-model.md ("The model boundary") is the prose version.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings

from coevo.policies.client import PolicyClient
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.workers.test_escape import open_pipes, processes_with, sandbox_children
from workers import boundary as boundary_module
from workers import program as program_module
from workers.boundary import ModelBoundary
from workers.environments.base import Verdict
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, RolloutResult, execute_rollout

REPO_ROOT = Path(__file__).resolve().parents[2]

# The in-sandbox side of every attack: raw HTTP to the boundary through the forwarder.
PROBE = r'''
import errno, json, os, pathlib, select, socket, sys, time, urllib.parse

BASE = os.environ["OPENAI_BASE_URL"]
KEY = os.environ["OPENAI_API_KEY"]
PORT = urllib.parse.urlsplit(BASE).port


def answer(value):
    with open(os.environ["COEVO_ANSWER_FILE"], "w") as f:
        json.dump(value, f)


def connect(timeout=5.0):
    return socket.create_connection(("127.0.0.1", PORT), timeout)


def head(method, path, *, key=KEY, length=None, extra=()):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if key is not None:
        lines.append("Authorization: Bearer " + key)
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += list(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def request(method, path, body=None, *, key=KEY, extra=()):
    if body is None:
        data = b""
    else:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    length = None if body is None else len(data)
    return head(method, path, key=key, length=length, extra=extra) + data


_early = {}  # socket -> bytes read past the reply before (pipelined replies)


def read_reply(sock):
    """One HTTP reply on sock as {status, headers, body}; None if the server closed first."""
    data = _early.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        rest, _early[sock] = rest[:length], rest[length:]
    else:  # a stream: until the server closes
        while chunk := sock.recv(65536):
            rest += chunk
    return {"status": int(lines[0].split()[1]), "headers": headers,
            "body": rest.decode(errors="replace")}


def exchange(data, timeout=5.0):
    """Send raw bytes on a fresh connection; the reply, or how the connection failed."""
    with connect(timeout) as sock:
        try:
            sock.sendall(data)
            return read_reply(sock)
        except OSError as exc:
            return {"error": type(exc).__name__}


def chat(content, *, key=KEY, **extra):
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], **extra}
    return exchange(request("POST", "/v1/chat/completions", body, key=key))


def closed(sock, wait=0.0):
    """Whether the server has closed sock (EOF or a reset) within `wait` seconds; a reply
    that came instead counts as closed only if the connection ended after it."""
    deadline = time.monotonic() + wait
    while True:
        readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            return False
        try:
            if not sock.recv(65536):
                return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False


def trickle(sock, prefix, drip, every, *, limit_s):
    """Send prefix, then drip one byte every `every` seconds: seconds until the server cut
    the connection, or None if it never did within limit_s."""
    started = time.monotonic()
    try:
        sock.sendall(prefix)
        i = 0
        while time.monotonic() - started < limit_s:
            if closed(sock, every):
                return round(time.monotonic() - started, 2)
            sock.sendall(drip[i % len(drip):][:1])
            i += 1
    except OSError:
        return round(time.monotonic() - started, 2)
    return None
'''

# An honest program beside the attacks: three calls, each answered by its own policy.
HONEST = """
import json, os, urllib.request

def chat(content):
    body = json.dumps({{"model": "gpt-4o", "messages": [{{"role": "user", "content": content}}]}})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
        headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"}})
    return json.load(urllib.request.urlopen(request, timeout=20))

for i in range(3):
    reply = chat("{marker} is the sky blue? (" + str(i) + ")")
    assert reply["model"] == "base", reply
    assert reply["choices"][0]["message"]["content"] == "yes", reply
json.dump("yes", open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def program(tmp_path: Path, script: str, *, name: str = "attack", wall: int = 20) -> Path:
    """A program harness whose command is ``python3 main.py``."""
    harness = tmp_path / name
    harness.mkdir()
    (harness / "harness.toml").write_text(
        f'[harness]\nname = "{name}"\ncommand = ["python3", "main.py"]\n\n'
        f"[limits]\nmax_model_calls = 50\nwall_time_s = {wall}\n"
    )
    (harness / "main.py").write_text(textwrap.dedent(script))
    return harness


def attack(tmp_path: Path, script: str, **kwargs) -> Path:
    return program(tmp_path, PROBE + textwrap.dedent(script), **kwargs)


def run_program(
    harness: Path, url: str, *, expected: object = None, client: PolicyClient | None = None
) -> RolloutResult:
    """One rollout. ``expected``: the answer that passes; None: any answer passes (an attack's
    answer is its report). ``client``: a policy client that outlives the rollout (a worker's
    does), instead of one closed with it."""
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="q1",
        task_view={"question": "is the sky blue?"},
        knob_overrides={},
        seed=11,
        wall_time_s=60,
        policy_version="base",
    )

    def verify(answer: object) -> Verdict:
        passed = expected is None or answer == expected
        return Verdict(passed=passed, score=float(passed), detail=f"answer {answer!r}")

    if client is not None:
        return execute_rollout(inputs, policy=client, verify=verify)
    with PolicyClient(url, model="scripted", retries=0, backoff_s=0.01) as own:
        return execute_rollout(inputs, policy=own, verify=verify)


def honest_rollout(tmp_path: Path, url: str) -> tuple[RolloutResult, str]:
    marker = f"honest-{uuid.uuid4().hex}"
    harness = program(tmp_path, HONEST.format(marker=marker), name=f"honest-{marker[-8:]}")
    return run_program(harness, url, expected="yes"), marker


def assert_honest(result: RolloutResult, marker: str) -> None:
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    calls = model_calls(result)
    assert len(calls) == 3 and result.model_calls == 3
    assert all(marker in call["messages"][0]["content"] for call in calls)


def model_calls(result: RolloutResult) -> list[dict]:
    return [s.payload for s in result.steps if s.kind == "model_call"]


def alongside_honest(
    harness: Path, tmp_path: Path, url: str
) -> tuple[RolloutResult, float, RolloutResult]:
    """Run the attack and an honest program rollout at the same time on this worker; the
    honest one must pass with only its own calls, the attack's trace must hold none of them."""
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        attacked = pool.submit(run_program, harness, url)
        time.sleep(0.5)  # let the attack get going first
        honest, marker = pool.submit(honest_rollout, tmp_path, url).result()
        result = attacked.result()
        seconds = time.monotonic() - started
    assert_honest(honest, marker)
    assert marker not in json.dumps([s.payload for s in result.steps], default=str)
    return result, seconds, honest


def report(result: RolloutResult) -> dict:
    assert isinstance(result.answer, dict), (result.outcome, result.detail, program_output(result))
    return result.answer


def program_output(result: RolloutResult) -> str:
    return "".join(str(s.payload.get("stdout")) for s in result.steps if s.kind == "program_output")


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def handler_threads(made: list[ModelBoundary]) -> list[threading.Thread]:
    """The boundaries' connection threads still running in the worker."""
    servers = {id(b._server) for b in made}
    return [
        t
        for t in threading.enumerate()
        if id(getattr(getattr(t, "_target", None), "__self__", None)) in servers
    ]


class BoundaryWatch:
    """The worker's side of each boundary, sampled every few milliseconds: the most
    connections it held at once, and the longest any one stayed open."""

    def __init__(self, made: list[ModelBoundary]) -> None:
        self.made = made
        self.peak: dict[int, int] = {}
        self.longest: dict[int, float] = {}
        self._first_seen: dict[socket.socket, float] = {}  # (keeps ids from being reused)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> BoundaryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for i, made in enumerate(list(self.made)):
                with made._server.open_lock:
                    held = list(made._server.open)
                self.peak[i] = max(self.peak.get(i, 0), len(held))
                for sock in held:
                    first = self._first_seen.setdefault(sock, now)
                    self.longest[i] = max(self.longest.get(i, 0.0), now - first)
            time.sleep(0.005)


@pytest.fixture
def server():
    policy = ScriptedPolicy(rules=[("sky", "yes")], default="no")
    with ScriptedOpenAIServer(policy) as running:
        yield running


@pytest.fixture
def boundaries(monkeypatch) -> list[ModelBoundary]:
    """Every boundary the rollouts of the test made (the worker's side of each rollout)."""
    made: list[ModelBoundary] = []

    class Recorded(ModelBoundary):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(program_module, "ModelBoundary", Recorded)
    return made


@pytest.fixture
def short_timeouts(monkeypatch):
    monkeypatch.setattr(boundary_module, "IO_TIMEOUT_S", 1.0)
    return 1.0


@pytest.fixture(autouse=True)
def worker_stays_healthy(server, boundaries, tmp_path):
    pipes_before = open_pipes()
    yield
    assert sandbox_children() == []
    for made in boundaries:
        assert not made.socket_dir.exists(), "a rollout's socket outlived it"
        assert not made._thread.is_alive()
    wait_until(lambda: handler_threads(boundaries) == [], timeout_s=5)
    honest, marker = honest_rollout(tmp_path, server.url)
    assert_honest(honest, marker)
    assert open_pipes() <= pipes_before


# --- other rollouts, the worker's ports and files ------------------------------------------

SEARCH = r'''
import stat

SKIP = {"/proc", "/sys", "/usr", sys.prefix, sys.base_prefix}


def sockets_and_hits(needles, exclude=()):
    """Every socket file the program can find, and every file or /proc entry holding a needle."""
    found, hits = [], []
    for dirpath, dirnames, filenames in os.walk("/"):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in SKIP]
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                found.append(path)
            elif stat.S_ISREG(mode) and path not in exclude:
                try:
                    data = open(path, "rb").read(1 << 20)
                except OSError:
                    continue
                hits += [path for needle in needles if needle.encode() in data]
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for what in ("environ", "cmdline", "net/unix", "mountinfo"):
            try:
                data = open(f"/proc/{pid}/{what}", "rb").read()
            except OSError:
                continue
            hits += [f"/proc/{pid}/{what}" for needle in needles if needle.encode() in data]
    return sorted(found), hits
'''

VICTIM = (
    PROBE
    + """
first = chat("MARKER: is the sky blue?")
assert first["status"] == 200, first
go = pathlib.Path("/harness/go")
deadline = time.monotonic() + 20
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
second = chat("MARKER: sure the sky is blue?")
answer("yes" if second["status"] == 200 else second)
"""
)

INTRUDER = """
leaked = json.loads(pathlib.Path("/harness/leaked.json").read_text())
out = {}
out["sockets"], out["hits"] = sockets_and_hits(
    [leaked["key"], leaked["marker"], leaked["dir"]], exclude={"/harness/leaked.json"})
out["unix sockets"] = open("/proc/net/unix").read().count("coevo-boundary")
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(leaked["socket"])
    out["their socket"] = "connected"
except OSError as exc:
    out["their socket"] = type(exc).__name__
their = leaked["key"]
out["their key"] = [
    exchange(request("GET", "/v1/models", key=their))["status"],
    exchange(request("GET", "/v1/models", key=None, extra=["x-api-key: " + their]))["status"],
    exchange(request("GET", "/v1/models", key=None, extra=["api-key: " + their]))["status"],
    chat(leaked["marker"] + ": is the sky blue?", key=their)["status"],
]
# Their conversation, sent with its own key: an answer of its own policy, in its own tree.
body = {"messages": [{"role": "user", "content": leaked["marker"] + ": is the sky blue?"},
                     {"role": "assistant", "content": "yes"},
                     {"role": "user", "content": "and the grass?"}]}
reply = exchange(request("POST", "/v1/chat/completions", body))
out["their conversation"] = [reply["status"], json.loads(reply["body"])["model"]]
answer(out)
"""


def test_it_keeps_a_program_from_another_rollouts_socket_key_and_session(
    tmp_path, server, boundaries
):
    marker = f"victim-{uuid.uuid4().hex}"
    victim_dir = program(tmp_path, VICTIM.replace("MARKER", marker), name="victim")
    intruder_dir = attack(tmp_path, SEARCH + INTRUDER, name="intruder")
    with ThreadPoolExecutor(1) as pool:
        victim_future = pool.submit(run_program, victim_dir, server.url, expected="yes")
        wait_until(lambda: marker in json.dumps(server.policy.requests))
        (theirs,) = boundaries
        (intruder_dir / "leaked.json").write_text(
            json.dumps(
                {
                    "key": theirs.token,
                    "socket": str(theirs.socket_path),
                    "dir": theirs.socket_dir.name,
                    "marker": marker,
                }
            )
        )
        try:
            intruder = run_program(intruder_dir, server.url)
        finally:
            (victim_dir / "go").write_text("")
        victim = victim_future.result()

    seen = report(intruder)
    # Its own socket at most (a root worker's sandbox cannot even list its directory).
    assert seen["sockets"] in ([], ["/run/coevo/api.sock"])
    assert seen["hits"] == [] and seen["unix sockets"] == 0
    assert seen["their socket"] == "FileNotFoundError"
    assert seen["their key"] == [401, 401, 401, 401]
    assert seen["their conversation"] == [200, "base"]
    # Its one call is a conversation of its own; the victim's trace holds only the victim's.
    (call,) = model_calls(intruder)
    assert (call["parent"], call["relation"]) == (None, "starts")
    assert victim.outcome == RolloutOutcome.PASSED, victim.detail
    victim_calls = model_calls(victim)
    assert len(victim_calls) == 2
    assert all(c["messages"][0]["content"].startswith(marker) for c in victim_calls)
    assert [c["relation"] for c in victim_calls] == ["starts", "starts"]


@pytest.fixture
def listener():
    """A TCP server on the host's 127.0.0.1 (a stand-in for the worker's metrics port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def test_it_gives_the_program_no_way_to_the_hosts_services(tmp_path, server, listener):
    ports = {
        "postgresql": 5432,
        "redis": 6379,
        "policy server": server.port,
        "worker port": listener.getsockname()[1],
    }
    unix = [
        "/var/run/postgresql/.s.PGSQL.5432",
        "/run/postgresql/.s.PGSQL.5432",
        "/tmp/.s.PGSQL.5432",
        "/var/run/redis/redis-server.sock",
        "/run/redis/redis.sock",
    ]
    harness = attack(
        tmp_path,
        f"""
        out = {{}}
        for name, port in {ports!r}.items():
            for host in ("127.0.0.1", "::1", "localhost"):
                try:
                    socket.create_connection((host, port), 1).close()
                    out[f"{{name}} {{host}}"] = "connected"
                except OSError as exc:
                    out[f"{{name}} {{host}}"] = type(exc).__name__
        for path in {unix!r}:
            try:
                socket.socket(socket.AF_UNIX).connect(path)
                out[path] = "connected"
            except OSError as exc:
                out[path] = type(exc).__name__
        # Every port of the sandbox's own loopback: only the forwarder answers.
        listening = []
        for port in range(1, 65536):
            s = socket.socket()
            # (a connection to itself, TCP's simultaneous open on an ephemeral port, is not
            # a listener)
            if s.connect_ex(("127.0.0.1", port)) == 0 and s.getsockname()[1] != port:
                listening.append(port)
            s.close()
        out["listening"] = listening
        out["forwarder"] = PORT
        answer(out)
        """,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen.pop("listening") == [seen.pop("forwarder")]
    assert "connected" not in seen.values(), seen
    with pytest.raises(BlockingIOError):
        listener.accept()


# --- the capability -------------------------------------------------------------------------


def test_it_refuses_every_key_but_the_rollouts_own(tmp_path, server, boundaries):
    # A rollout that ended: its key and its socket's place.
    first = run_program(program(tmp_path, HONEST.format(marker="first"), name="first"), server.url)
    assert first.outcome == RolloutOutcome.PASSED, first.detail
    (old,) = boundaries
    assert not old.socket_dir.exists()
    requests_before = len(server.policy.requests)
    harness = attack(
        tmp_path,
        """
        import random, string
        old = json.loads(pathlib.Path("/harness/old.json").read_text())
        alphabet = string.ascii_letters + string.digits + "-_"
        keys = {"old": old["key"], "empty": "", "null": "null", "own + x": KEY + "x",
                "own - 1": KEY[:-1], "own upper": KEY.upper(), "own reversed": KEY[::-1],
                "own spaced": KEY[:10] + " " + KEY[10:], "own twice": KEY + KEY}
        keys.update({f"random {i}": "".join(random.choice(alphabet) for _ in range(43))
                     for i in range(50)})
        out = {}
        for name, key in keys.items():
            out[name] = [
                exchange(request("GET", "/v1/models", key=key))["status"],
                chat("is the sky blue?", key=key)["status"],
            ]
        # The key elsewhere than in a key header: in the URL, a cookie, basic auth.
        out["query"] = exchange(request("GET", "/v1/models?api_key=" + KEY, key=None))["status"]
        out["cookie"] = exchange(
            request("GET", "/v1/models", key=None, extra=["Cookie: api_key=" + KEY]))["status"]
        import base64
        basic = base64.b64encode(f"user:{KEY}".encode()).decode()
        out["basic"] = exchange(
            request("GET", "/v1/models", key=None, extra=["Authorization: Basic " + basic]))["status"]
        out["huge"] = exchange(request("GET", "/v1/models", key="k" * 70000)).get("status")
        out["old socket"] = os.path.exists(old["socket"])
        out["own"] = chat("is the sky blue?")["status"]
        answer(out)
        """,
    )
    (harness / "old.json").write_text(
        json.dumps({"key": old.token, "socket": str(old.socket_path)})
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen.pop("own") == 200
    assert seen.pop("old socket") is False
    assert seen.pop("huge") in (400, 431)
    for name, statuses in seen.items():
        assert statuses in ([401, 401], 401), (name, statuses)
    # Only its own call reached the policy.
    assert len(server.policy.requests) == requests_before + 1
    assert result.model_calls == 1


# --- other models, other URLs -----------------------------------------------------------------


def test_it_answers_any_model_name_with_the_rollouts_policy(tmp_path, server):
    names = ["gpt-4o", "claude-3-opus", "other-policy-version", "../../etc/passwd",
             "http://127.0.0.1:5432/", "", 123, {"id": "x"}, None]  # fmt: skip
    harness = attack(
        tmp_path,
        f"""
        out = {{"chat": [], "completions": []}}
        for name in {names!r}:
            reply = chat("is the sky blue?", model=name)
            out["chat"].append(json.loads(reply["body"])["model"])
            body = {{"model": name, "prompt": "sky?", "max_tokens": 4}}
            reply = exchange(request("POST", "/v1/completions", body))
            out["completions"].append(json.loads(reply["body"])["model"])
        models = exchange(request("GET", "/v1/models"))
        out["models"] = [m["id"] for m in json.loads(models["body"])["data"]]
        out["one model"] = exchange(request("GET", "/v1/models/gpt-4o"))["status"]
        answer(out)
        """,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen["chat"] == seen["completions"] == ["base"] * len(names)
    assert seen["models"] == ["base"] and seen["one model"] == 404
    assert {r["model"] for r in server.policy.requests} == {"scripted"}
    assert len(server.policy.requests) == 2 * len(names)


URLS = {
    # (what the program sends, the statuses it may get)
    "absolute URL to a host port": (
        b"POST http://127.0.0.1:{port}/v1/chat/completions HTTP/1.1\r\n{auth}"
        b"Content-Length: 2\r\n\r\n{}",
        {404},
    ),
    "proxy request": (b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n{auth}\r\n", {404}),
    "CONNECT": (
        b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n",
        {405},
    ),
    "traversal": (b"GET /v1/models/../../../etc/passwd HTTP/1.1\r\n{auth}\r\n", {404}),
    "encoded traversal": (b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n{auth}\r\n", {404}),
    "double slash": (b"GET //etc/passwd HTTP/1.1\r\n{auth}\r\n", {404}),
    "proc": (b"GET /v1/../proc/self/environ HTTP/1.1\r\n{auth}\r\n", {404}),
    "OPTIONS": (b"OPTIONS * HTTP/1.1\r\n{auth}\r\n", {405}),
    "TRACE": (b"TRACE /v1/models HTTP/1.1\r\n{auth}\r\n", {405}),
    "HEAD": (b"HEAD /v1/models HTTP/1.1\r\n{auth}\r\n", {405}),
    "DELETE": (b"DELETE /v1/models HTTP/1.1\r\n{auth}\r\n", {405}),
    "unknown method": (b"BREW /v1/models HTTP/1.1\r\n{auth}\r\n", {405, 501}),
    "bad request line": (b"GARBAGE\r\n\r\n", {400}),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400, 405, 505}),
}


@pytest.mark.parametrize("attempt", list(URLS))
def test_it_serves_no_url_outside_the_boundary(tmp_path, server, listener, attempt):
    data, statuses = URLS[attempt]
    port = listener.getsockname()[1]
    harness = attack(
        tmp_path,
        f"""
        data = {data!r}.replace(b"{{port}}", b"{port}")
        data = data.replace(b"{{auth}}", ("Authorization: Bearer " + KEY + "\\r\\n").encode())
        with connect() as sock:
            sock.sendall(data)
            reply = read_reply(sock)
            # Nothing after it is tunnelled anywhere: the connection ends or answers HTTP.
            try:
                sock.sendall(b"\\x16\\x03\\x01 SELECT 1;\\r\\n\\r\\n")
                after = read_reply(sock)
            except OSError:
                after = None
        answer({{"reply": reply, "after": after and after["status"]}})
        """,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    reply = seen["reply"]
    assert reply["status"] in statuses, reply
    if attempt != "HEAD":
        assert json.loads(reply["body"])["error"]["message"], reply
        assert "<html" not in reply["body"].lower()
    assert seen["after"] in (None, 400)
    assert "root:" not in json.dumps(seen)
    assert server.policy.requests == []
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_host_headers_change_nothing(tmp_path, server, listener):
    port = listener.getsockname()[1]
    hosts = [f"127.0.0.1:{port}", "127.0.0.1:5432", "api.openai.com", "localhost:6379", "[::1]"]
    harness = attack(
        tmp_path,
        f"""
        out = []
        for host in {hosts!r}:
            body = json.dumps({{"messages": [{{"role": "user", "content": "sky?"}}]}}).encode()
            data = (f"POST /v1/chat/completions HTTP/1.1\\r\\nHost: {{host}}\\r\\n"
                    f"X-Forwarded-Host: {{host}}\\r\\nAuthorization: Bearer {{KEY}}\\r\\n"
                    f"Content-Length: {{len(body)}}\\r\\n\\r\\n").encode() + body
            reply = exchange(data)
            out.append([reply["status"], json.loads(reply["body"])["model"]])
        answer(out)
        """,
    )

    result = run_program(harness, server.url)

    assert report_list(result) == [[200, "base"]] * len(hosts)
    with pytest.raises(BlockingIOError):
        listener.accept()


def report_list(result: RolloutResult) -> list:
    assert isinstance(result.answer, list), (result.outcome, result.detail, program_output(result))
    return result.answer


# --- oversized bodies, slow clients, endless streams, too many connections ------------------


def test_it_refuses_oversized_and_lying_bodies(tmp_path, server, short_timeouts):
    limit = boundary_module.MAX_BODY_BYTES
    harness = attack(
        tmp_path,
        f"""
        path = "/v1/chat/completions"
        out = {{}}
        for name, length in [("a terabyte", 10**12), ("one past the limit", {limit} + 1),
                             ("negative", -1), ("not a number", "12abc"), ("two", "10, 20")]:
            with connect() as sock:
                sock.sendall(head("POST", path, extra=[f"Content-Length: {{length}}"]))
                reply = read_reply(sock)
                out[name] = reply and [reply["status"], closed(sock, 2)]
        with connect() as sock:  # and really sending it: refused before it is read
            sock.sendall(head("POST", path, length={limit} + 1))
            reply = read_reply(sock)
            try:
                sock.sendall(b"[" * ({limit} + 1))
                sent = "all"
            except OSError as exc:
                sent = type(exc).__name__
            out["sent past the limit"] = [reply["status"], sent]
        with connect() as sock:
            sock.sendall(head("POST", path, extra=["Transfer-Encoding: chunked"])
                         + b"ffffffff\\r\\n" + b"x" * 65536)
            reply = read_reply(sock)
            out["chunked"] = [reply["status"], closed(sock, 2)]
        # A Content-Length that promises more than comes: the connection is cut, unanswered.
        with connect() as sock:
            started = time.monotonic()
            sock.sendall(head("POST", path, length=1000) + b'{{"messages"')
            out["promises more"] = [closed(sock, 5), round(time.monotonic() - started, 1)]
        # One that promises less: the rest is read as the next request, and refused.
        with connect() as sock:
            body = json.dumps({{"messages": [{{"role": "user", "content": "sky?"}}]}}).encode()
            sock.sendall(head("POST", path, length=10) + body + b"\\r\\n\\r\\n")
            first = read_reply(sock)
            second = read_reply(sock)
            out["promises less"] = [first["status"], second and second["status"]]
        out["afterwards"] = chat("is the sky blue?")["status"]
        answer(out)
        """,
    )

    result, seconds, _ = alongside_honest(harness, tmp_path, server.url)

    seen = report(result)
    for name in ("a terabyte", "one past the limit", "negative"):
        assert seen[name] == [413, True], (name, seen[name])
    assert seen["not a number"] == seen["two"] == [411, True]
    assert seen["sent past the limit"][0] == 413
    assert seen["chunked"] == [411, True]
    cut, after = seen["promises more"]
    assert cut is True and after <= short_timeouts + 1.5
    assert seen["promises less"] == [400, 400]
    assert seen["afterwards"] == 200
    assert result.model_calls == 1 and seconds < 15


SLOW = {
    # (what comes at once, what then drips, a byte every so many seconds)
    "slowloris headers": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", b"X-a: b\r\n"),
    "a body a byte at a time": (b"", b'{"messages": [{"role": "user", "content": "sky?"}]}'),
    "an idle connection": (b"", b""),
}


@pytest.mark.parametrize("client", list(SLOW))
def test_it_cuts_slow_clients(tmp_path, server, short_timeouts, client):
    prefix, drip = SLOW[client]
    harness = attack(
        tmp_path,
        f"""
        prefix, drip = {prefix!r}, {drip!r}
        if drip.startswith(b"{{"):
            prefix = head("POST", "/v1/chat/completions", length=len(drip))
        cuts = []
        for _ in range(3):
            with connect() as sock:
                if drip:
                    cuts.append(trickle(sock, prefix, drip, 0.25, limit_s=6))
                else:
                    started = time.monotonic()
                    cuts.append(closed(sock, 6) and round(time.monotonic() - started, 2))
        answer({{"cuts": cuts, "afterwards": chat("is the sky blue?")["status"]}})
        """,
    )

    result, seconds, _ = alongside_honest(harness, tmp_path, server.url)

    seen = report(result)
    # Each is cut within the read timeout of its request's start (checked every 0.2 s), even
    # though no single read ever waits that long.
    assert all(cut and cut <= short_timeouts + 1.0 for cut in seen["cuts"]), seen
    assert seen["afterwards"] == 200
    assert result.model_calls == 1


def test_it_ends_endless_streams(tmp_path, server, boundaries, short_timeouts):
    harness = attack(
        tmp_path,
        r"""
        def endless(prefix, chunk, limit=64 << 20):
            # Send as fast as possible: how much went before the server answered or cut it.
            with connect(10) as sock:
                sent = 0
                started = time.monotonic()
                try:
                    sock.sendall(prefix)
                    while sent < limit:
                        if select.select([sock], [], [], 0)[0]:
                            break
                        sent += sock.send(chunk)
                except OSError:
                    pass
                try:
                    reply = read_reply(sock)
                except OSError:
                    reply = None
                return [reply and reply["status"], sent < limit,
                        round(time.monotonic() - started, 1)]

        auth = "Authorization: Bearer " + KEY + "\r\n"
        out = {
            "headers": endless(f"GET /v1/models HTTP/1.1\r\n{auth}".encode(), b"X-a: b\r\n" * 512),
            "one header": endless(f"GET /v1/models HTTP/1.1\r\n{auth}X-a: ".encode(), b"a" * 4096),
            "request line": endless(b"GET /", b"a" * 4096),
            "chunked body": endless(
                f"POST /v1/chat/completions HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
                .encode(), b"1000\r\n" + b"x" * 4096 + b"\r\n"),
        }
        # Requests pipelined for 4 s without ever reading a reply: the worker ends the
        # connection once its writes stall (seen from the worker's side; the forwarder in
        # between holds this end open as long as nobody reads).
        with connect(10) as sock:
            one = request("GET", "/v1/models")
            sent, started = 0, time.monotonic()
            sock.setblocking(False)
            while time.monotonic() - started < 4:
                try:
                    sent += sock.send(one * 64)
                except BlockingIOError:
                    time.sleep(0.05)
                except OSError:
                    break
            out["never reads"] = sent
        # A stream it asks for and never reads.
        sock = connect()
        sock.sendall(request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "sky?"}], "stream": True}))
        time.sleep(2.5)
        sock.settimeout(2)
        out["stream"] = read_reply(sock)["body"].endswith("data: [DONE]\n\n")
        sock.close()
        out["afterwards"] = chat("is the sky blue?")["status"]
        answer(out)
        """,
    )

    with BoundaryWatch(boundaries) as watch:
        result, seconds, _ = alongside_honest(harness, tmp_path, server.url)

    seen = report(result)
    assert seen["headers"][:2] == [431, True], seen
    assert seen["one header"][:2] == [431, True], seen
    assert seen["request line"][:2] == [414, True], seen
    assert seen["chunked body"][:2] == [411, True], seen
    assert seen["never reads"] > 0
    # Its longest connection: the stream it did not read for 2.5 s (written whole, then
    # closed), not the 4 s of requests it never read the replies of.
    assert watch.longest[0] < 3.5, watch.longest
    assert seen["stream"] is True  # it ends, whole, though nobody read it as it came
    assert seen["afterwards"] == 200
    assert result.model_calls == 2 and seconds < 20


def test_it_bounds_the_connections_of_one_rollout(tmp_path, server, boundaries, monkeypatch):
    monkeypatch.setattr(boundary_module, "MAX_CONNECTIONS", 8)
    harness = attack(
        tmp_path,
        """
        socks = []
        for _ in range(100):
            sock = connect()
            sock.sendall(b"GET /v1/models HTTP/1.1\\r\\n")  # and never finishes
            socks.append(sock)
        time.sleep(1)
        refused = sum(closed(sock, 0) for sock in socks)
        for sock in socks:
            sock.close()
        time.sleep(0.3)
        answer({"refused": refused, "afterwards": chat("is the sky blue?")["status"]})
        """,
    )
    with BoundaryWatch(boundaries) as watch:
        result, seconds, _ = alongside_honest(harness, tmp_path, server.url)

    seen = report(result)
    assert seen["refused"] >= 100 - 8, seen
    assert 0 < watch.peak[0] <= 8, watch.peak
    assert seen["afterwards"] == 200, seen
    assert seconds < 15


def test_the_forwarder_outlives_a_program_that_exhausts_its_descriptors_and_threads(
    tmp_path, server
):
    # Past the sandbox's open-file limit (256 a process) and process limit (128): the
    # forwarder in the launcher runs out of both while the program holds its connections.
    harness = attack(
        tmp_path,
        """
        socks, error = [], None
        while len(socks) < 400:
            try:
                sock = connect(2)
                sock.sendall(b"GET /v1/models HTTP/1.1\\r\\n")
            except OSError as exc:
                error = type(exc).__name__
                break
            socks.append(sock)
        time.sleep(1)
        for sock in socks:
            sock.close()
        time.sleep(0.5)
        replies = [chat("is the sky blue?") for _ in range(2)]
        answer({"opened": len(socks), "error": error,
                "afterwards": [r and r.get("status") for r in replies]})
        """,
        wall=30,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen["opened"] > 120, seen
    assert seen["afterwards"] == [200, 200], seen


def test_a_flood_of_requests_does_not_starve_the_rollout_beside_it(tmp_path, server):
    harness = attack(
        tmp_path,
        """
        import threading

        stop = time.monotonic() + 4
        answered = [0]

        def flood(data):
            with connect(10) as sock:
                sock.settimeout(10)
                while time.monotonic() < stop:
                    sock.sendall(data * 16)
                    for _ in range(16):
                        if read_reply(sock) is None:
                            return
                        answered[0] += 1

        kinds = [request("GET", "/v1/models"), request("GET", "/v1/models", key="wrong"),
                 request("POST", "/nowhere", {}), request("POST", "/v1/chat/completions", [1])]
        threads = [threading.Thread(target=flood, args=(kinds[i % 4],)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        answer({"answered": answered[0], "afterwards": chat("is the sky blue?")["status"]})
        """,
    )

    result, seconds, _ = alongside_honest(harness, tmp_path, server.url)

    seen = report(result)
    assert seen["answered"] > 1000 and seen["afterwards"] == 200
    assert seconds < 15


# --- malformed requests -----------------------------------------------------------------------

MALFORMED = {
    "not JSON": b"{'messages': nope",
    "empty": b"",
    "invalid UTF-8": b'{"messages": [{"role": "user", "content": "\xff\xfe sky"}]}',
    "a lone surrogate": b'{"messages": [{"role": "user", "content": "sky \\ud800"}]}',
    "deeply nested": b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "a number with 100,000 digits": b'{"messages": [], "seed": ' + b"9" * 100_000 + b"}",
    "a seed past 64 bits": b'{"messages": [{"role": "user", "content": "sky"}], "seed": '
    + str(2**70).encode()
    + b"}",
    "an overflowing float": b'{"messages": [{"role": "user", "content": "sky"}], '
    b'"temperature": 1e999}',
    "NaN": b'{"messages": [{"role": "user", "content": "sky"}], "top_p": NaN}',
    "Infinity in a message": b'{"messages": [{"role": "user", "content": "sky", "x": Infinity}]}',
    "an array": b"[1, 2, 3]",
    "a string": b'"sky"',
    "messages as an object": b'{"messages": {"role": "user", "content": "sky"}}',
    "a message without a role": b'{"messages": [{"content": "sky"}]}',
    "n of a million": b'{"messages": [{"role": "user", "content": "sky"}], "n": 1000000}',
}


def test_it_refuses_malformed_requests_before_any_model_sees_them(tmp_path, server):
    harness = attack(
        tmp_path,
        f"""
        out = {{}}
        for name, body in {MALFORMED!r}.items():
            reply = exchange(request("POST", "/v1/chat/completions", body))
            out[name] = reply and [reply["status"], json.loads(reply["body"])["error"]["message"]]
        # Odd but well-formed: the policy answers, and the call is counted and recorded.
        odd = {{"messages": [{{"role": "assistant", "content": {{"a": 1}}, "tool_calls": 5}},
                             {{"role": "tool", "tool_call_id": [1], "content": None}},
                             {{"role": "user", "content": "sky \\u0000?"}}]}}
        reply = exchange(request("POST", "/v1/chat/completions", odd))
        out["odd"] = [reply["status"], json.loads(reply["body"])["model"]]
        answer(out)
        """,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen.pop("odd") == [200, "base"], program_output(result)
    for name, reply in seen.items():
        assert reply is not None and reply[0] == 400, (name, reply)
        assert "Traceback" not in reply[1] and len(reply[1]) < 300, (name, reply)
    # Only the well-formed one reached the policy; every call counted is in the trace.
    assert len(server.policy.requests) == 1
    assert result.model_calls == 1 and len(model_calls(result)) == 1


# --- a daemon left behind --------------------------------------------------------------------


def test_it_kills_a_daemon_left_holding_the_socket_and_the_next_rollout_is_unaffected(
    tmp_path, server, boundaries
):
    marker = f"daemon{uuid.uuid4().hex}"
    harness = attack(
        tmp_path,
        f"""
        import subprocess
        # The daemon: a session of its own, the program's stdout kept open, a connection to
        # the boundary held, and model calls once the program has gone.
        subprocess.Popen([sys.executable, "daemon.py", "{marker}", str(os.getpid())],
                         start_new_session=True)
        reply = json.loads(chat("is the sky blue?")["body"])
        answer(reply["choices"][0]["message"]["content"])
        """,
        wall=15,
    )
    (harness / "daemon.py").write_text(
        PROBE
        + textwrap.dedent(
            """
            import signal
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            marker, main = sys.argv[1], sys.argv[2]
            held = connect()
            held.sendall(b"GET /v1/models HTTP/1.1\\r\\n")
            while os.path.exists(f"/proc/{main}"):
                time.sleep(0.005)
            while True:
                chat(marker + " after the program exited")
                print(marker, "still here", flush=True)
                time.sleep(0.02)
            """
        )
    )

    def calls_after_exit() -> int:
        return json.dumps(server.policy.requests).count(f"{marker} after")

    started = time.monotonic()
    result = run_program(harness, server.url, expected="yes")
    seconds = time.monotonic() - started
    at_the_end = calls_after_exit()

    assert result.outcome == RolloutOutcome.PASSED, (result.detail, program_output(result))
    assert seconds < 10, "the rollout waited for its daemon"
    (made,) = boundaries
    assert not made.socket_dir.exists()
    time.sleep(0.5)  # the kernel reaps a dead PID namespace asynchronously
    assert processes_with(marker=marker) == []
    # The worker learns of the exit within moments (a call the daemon slipped in before that
    # is the rollout's own), and nothing reaches the policy after the rollout's end.
    assert at_the_end <= 3 and calls_after_exit() == at_the_end
    assert result.model_calls == len(model_calls(result)) == 1 + at_the_end
    honest, honest_marker = honest_rollout(tmp_path, server.url)
    assert_honest(honest, honest_marker)
    assert marker not in json.dumps([s.payload for s in honest.steps])


def test_a_call_still_in_flight_when_the_rollout_ends_changes_nothing(tmp_path, server):
    server.policy.latency_s = 1.5
    harness = attack(
        tmp_path,
        """
        import threading
        threading.Thread(target=chat, args=("is the sky blue? late",), daemon=True).start()
        time.sleep(0.3)  # the call is with the policy now
        answer("yes")
        os._exit(0)
        """,
    )

    try:
        with PolicyClient(server.url, model="scripted", retries=0) as client:
            result = run_program(harness, server.url, expected="yes", client=client)
            before = (result.model_calls, result.prompt_tokens, len(result.steps), result.outcome)
            wait_until(lambda: len(server.policy.requests) == 1)
            time.sleep(server.policy.latency_s + 0.5)  # the policy has answered the late call
    finally:
        server.policy.latency_s = 0.0

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert (result.model_calls, result.prompt_tokens, len(result.steps), result.outcome) == before
    assert result.model_calls == 0 and model_calls(result) == []


# --- probing the worker through the boundary ------------------------------------------------


def worker_secrets(made: list[ModelBoundary], server: ScriptedOpenAIServer, secret: str) -> dict:
    """What no error body may show: the planted secret, the worker's paths and addresses."""
    found = {
        "secret": secret,
        "repository": str(REPO_ROOT),
        "python": sys.prefix,
        "home": str(settings.COEVO_HOME),
        "policy server": f"127.0.0.1:{server.port}",
        "traceback": "Traceback",
        "source file": 'File "',
        "boundary dir": "coevo-boundary-",
    }
    found.update({f"socket dir {i}": str(b.socket_dir) for i, b in enumerate(made)})
    return found


def test_error_bodies_show_nothing_of_the_worker(tmp_path, server, boundaries, monkeypatch):
    secret = f"planted-{uuid.uuid4().hex}"
    for name in ("DATABASE_URL", "COEVO_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, f"postgres://coevo:{secret}@db/{name}")
    # A bug in the worker (here, planted in its request check) must not reach the program.
    check = program_module._ProgramRollout.check_request

    def buggy_check(self, api, body):
        if isinstance(body, dict) and body.get("user") == "trigger":
            raise RuntimeError(f"{secret} in {REPO_ROOT}/workers/program.py")
        return check(self, api, body)

    monkeypatch.setattr(program_module._ProgramRollout, "check_request", buggy_check)
    harness = attack(
        tmp_path,
        """
        out = {}
        for path in ["/.env", "/etc/passwd", "/proc/self/environ", "/v1/../../../etc/shadow",
                     "/v1/models/../../proc/1/environ", "/%2e%2e/%2e%2e/proc/self/cwd",
                     "/v1/files", "/admin", "/debug", "/v1/chat/completions?x=" + "a" * 5000]:
            out["GET " + path[:60]] = exchange(request("GET", path))
            out["POST " + path[:60]] = exchange(request("POST", path, {"x": 1}))
        out["no key"] = exchange(request("GET", "/v1/models", key=None))
        out["bug"] = exchange(request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "sky?"}], "user": "trigger"}))
        out["bad JSON"] = exchange(request("POST", "/v1/chat/completions", b"{"))
        out["bad request"] = exchange(b"GET /\\x00\\x01 HTTP/9.9\\r\\n\\r\\n")
        out["afterwards"] = chat("is the sky blue?")
        answer(out)
        """,
    )

    result = run_program(harness, server.url)

    seen = report(result)
    assert seen.pop("afterwards")["status"] == 200
    assert seen["bug"]["status"] == 500
    assert json.loads(seen["bug"]["body"])["error"]["type"] == "server_error"
    text = json.dumps(seen)
    for what, value in worker_secrets(boundaries, server, secret).items():
        assert value not in text, what
    assert "root:" not in text
    for name, reply in seen.items():
        assert reply and reply["status"] >= 400, (name, reply)
        assert json.loads(reply["body"])["error"]["message"], (name, reply)


def test_a_policy_servers_refusal_reaches_the_program_without_its_address(
    tmp_path, boundaries, monkeypatch
):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps({"error": {"message": "the prompt is too long for this model"}})
            self.send_response(400)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

    refusing = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{refusing.server_address[1]}/v1"
    harness = attack(
        tmp_path,
        """
        first = chat("is the sky blue?")
        second = chat("is the sky blue?")
        answer({"first": first, "second": second})
        """,
    )
    try:
        result = run_program(harness, url)
    finally:
        refusing.shutdown()
        refusing.server_close()

    seen = report(result)
    for reply in seen.values():
        assert reply["status"] == 400
        message = json.loads(reply["body"])["error"]["message"]
        assert "the prompt is too long for this model" in message
        assert str(refusing.server_address[1]) not in message and "127.0.0.1" not in message
    rejected = [c for c in model_calls(result) if "rejected" in c]
    assert len(rejected) == 2  # the trace, for the project's members, says who refused


def test_an_outage_ends_the_rollout_without_showing_the_program_the_servers_address(
    tmp_path, server, monkeypatch
):
    sent: list[tuple[int, dict]] = []
    write = boundary_module._Handler._json

    def recorded(self, status, payload):
        sent.append((status, payload))
        write(self, status, payload)

    monkeypatch.setattr(boundary_module._Handler, "_json", recorded)
    harness = attack(
        tmp_path,
        """
        answer(chat("is the sky blue?"))
        """,
    )
    server.policy.fail_next = 10
    try:
        result = run_program(harness, server.url)
    finally:
        server.policy.fail_next = 0

    assert result.outcome == RolloutOutcome.INFRA_ERROR, result.detail
    assert f":{server.port}" in result.detail  # the worker's own record says which server
    ((status, payload),) = sent
    assert status == 503 and payload["error"]["type"] == "server_error"
    assert str(server.port) not in json.dumps(payload) and "127.0.0.1" not in json.dumps(payload)
