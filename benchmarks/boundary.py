"""Latency the model boundary adds to one model call, against a direct call to the same server.

A program harness in the real sandbox (bubblewrap, the launcher's 127.0.0.1 forwarder, the
worker's Unix-socket boundary, its checks, limits, call tree and trace) makes ``--calls``
sequential chat calls through ``$OPENAI_BASE_URL`` and times each with ``time.perf_counter``;
the benchmark process then makes the same calls, with the same code (``CLIENT``, a plain urllib
client), straight to the OpenAI-compatible test server, which answers after ``--latency``
seconds (0: as fast as it can). ``--rounds`` alternate the two, so drift in the machine's load
falls on both. No Celery, PostgreSQL or Redis: the rollout runs in this process through
``execute_rollout``, as a worker runs it, so what is measured is the boundary alone.

Reported, per call: p50 and p95 through the boundary, directly, and of the difference (call i
of a round through the boundary minus call i of the same round made directly). The worker's
own policy client is timed too (a wrapper around its ``forward``), which splits the added
time into the hop (sandbox → forwarder → socket → boundary → back) and the policy client
(httpx with keep-alive, against urllib's connection per call).

    .venv/bin/python benchmarks/boundary.py                   # --calls 50 --rounds 10 --latency 0
    .venv/bin/python benchmarks/boundary.py --latency 0.05

``--agent NAME`` measures a shipped CLI agent (examples/NAME: mini-swe-agent, claude-code, codex,
aider) instead, unmodified, on the small workspace task of its tests with the scripted fix its test
plays (tests/examples/test_<agent>.py): its dependency build cold (a fresh cache, from the
local wheel directory or npm cache scripts/test fills) and warm, then ``--rounds`` rollouts
through ``execute_rollout``, each timed from its start to the first model call and to its end.
The agent itself cannot be timed from inside, so the boundary's share of each call is what the
worker spends on it: from the request's headers read to the last byte of the reply written (the
body, the Messages or Responses translation, the checks, the trace, the stream) less the policy
client's time; the hop from the sandbox to the boundary's socket is the plain mode's figure.

    .venv/bin/python benchmarks/boundary.py --agent codex --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Run both in the sandbox (as the program) and in this process (the direct calls): one client.
CLIENT = """\
import json, time, urllib.request

def timed_calls(base_url, key, calls, warmup):
    body = json.dumps({"model": "gpt-4o", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "ping"}]}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    timings = []
    for i in range(warmup + calls):
        request = urllib.request.Request(base_url + "/chat/completions", data=body,
                                         headers=headers)
        started = time.perf_counter()
        with urllib.request.urlopen(request) as response:
            reply = json.load(response)
        elapsed = time.perf_counter() - started
        assert reply["choices"][0]["message"]["content"] == "ok", reply
        if i >= warmup:
            timings.append(elapsed)
    return timings
"""

PROGRAM = """\
import os
timings = timed_calls(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], {calls}, 1)
json.dump(timings, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""

HARNESS_TOML = """\
[harness]
name = "boundary-bench"
command = ["python3", "main.py"]

[limits]
max_model_calls = {max_calls}
max_tokens = 1000000
wall_time_s = 600
"""


class TimedPolicy:
    """The worker's policy client, with each ``forward`` timed (calls through the boundary
    arrive here one at a time: the program makes them in sequence)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.timings: list[float] = []
        self.lock = threading.Lock()

    def forward(self, api: str, body: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return self.client.forward(api, body)
        finally:
            with self.lock:
                self.timings.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0–100)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered))) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.0, help="server seconds per call")
    parser.add_argument("--agent", choices=AGENTS, help="a shipped CLI agent instead")
    args = parser.parse_args()
    if args.agent:
        return agent_main(args.agent, rounds=args.rounds)

    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    from coevo.policies.client import PolicyClient
    from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
    from workers.environments.base import Verdict
    from workers.outcomes import RolloutOutcome
    from workers.rollout import RolloutInputs, execute_rollout

    namespace: dict[str, Any] = {}
    exec(CLIENT, namespace)  # noqa: S102 (our own constant: the program's client, here too)
    timed_calls = namespace["timed_calls"]

    home = Path(tempfile.mkdtemp(prefix="coevo-boundary-bench-"))
    harness = home / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(HARNESS_TOML.format(max_calls=args.calls + 1))
    (harness / "main.py").write_text(CLIENT + PROGRAM.format(calls=args.calls))

    def verify(answer: Any) -> Verdict:
        ok = isinstance(answer, list) and len(answer) == args.calls
        return Verdict(passed=ok, score=float(ok), detail="")

    boundary: list[float] = []
    direct: list[float] = []
    worker: list[float] = []
    differences: list[float] = []
    load_before = os.getloadavg()
    with ScriptedOpenAIServer(ScriptedPolicy(default="ok", latency_s=args.latency)) as server:
        for round_ in range(args.rounds):
            policy = TimedPolicy(PolicyClient(server.url, model="scripted", retries=0))
            inputs = RolloutInputs(
                harness_dir=harness,
                task_key=f"r{round_}",
                task_view={"input": "ping"},
                knob_overrides={},
                seed=round_,
                wall_time_s=600,
                policy_version="bench",
            )
            # Alternate which goes first, so a change in load mid-round falls on both.
            if round_ % 2:
                straight = timed_calls(server.url, "none", args.calls, 1)
            with policy.client:
                result = execute_rollout(inputs, policy=policy, verify=verify)
            if result.outcome != RolloutOutcome.PASSED:
                print(f"round {round_}: {result.outcome} {result.detail}", file=sys.stderr)
                return 1
            if not round_ % 2:
                straight = timed_calls(server.url, "none", args.calls, 1)
            through = result.answer
            boundary += through
            direct += straight
            worker += policy.timings[1:]  # the program's warm-up call is not timed
            differences += [b - d for b, d in zip(through, straight, strict=True)]
    load_after = os.getloadavg()

    hop = [b - w for b, w in zip(boundary, worker, strict=True)]
    client = [w - d for w, d in zip(worker, direct, strict=True)]
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {machine()}")
    print(
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"{args.rounds} rounds x {args.calls} sequential chat calls, server latency "
        f"{args.latency * 1000:.0f} ms"
    )
    print(f"through the boundary (timed in the sandbox):  {ms(boundary)}")
    print(f"direct to the server (this process):          {ms(direct)}")
    print(f"added per call (boundary - direct, paired):    {ms(differences)}")
    print(f"  of which the hop (program - worker client):  {ms(hop)}")
    print(f"  of which the worker's policy client - direct: {ms(client)}")
    return 0


AGENTS = ("mini-swe-agent", "claude-code", "codex", "aider")
MODEL_CALL_PATHS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def agent_script(agent: str) -> Any:
    """The scripted fix of the agent's own test: the same tool calls, the same final answer."""
    from tests.support.openai_server import ScriptedPolicy

    if agent == "mini-swe-agent":
        from tests.examples.test_mini_swe_agent import EDIT, SUBMIT, TEST

        return ScriptedPolicy(
            tool_rules=[
                ("1 passed", [("bash", {"command": SUBMIT})]),
                ("Hello, {name}!", [("bash", {"command": TEST})]),
                ("Fix the typo", [("bash", {"command": EDIT})]),
            ],
            default="I am lost.",
        )
    if agent == "claude-code":
        from tests.examples.test_claude_code import EDIT

        return ScriptedPolicy(
            rules=[("has been updated", "Fixed the typo in greet.py.")],
            tool_rules=[("Fix the typo", [("Edit", EDIT)])],
            default="Nothing to do.",
        )
    if agent == "aider":
        from tests.examples.test_aider import FIX

        return ScriptedPolicy(rules=[("Fix the typo", FIX)], default="I am lost.")
    from tests.examples.test_codex import EXITED, SED

    return ScriptedPolicy(
        rules=[(EXITED, "Fixed the typo in greet.py.")],
        tool_rules=[("Fix the typo", [("exec_command", SED)])],
        default="Nothing to do.",
    )


class AgentTimedPolicy(TimedPolicy):
    """TimedPolicy that also keeps when each call reached it and charges its time to the
    boundary thread that made it (``owed``), so the boundary's own time can be told apart."""

    def __init__(self, client: Any, owed: threading.local) -> None:
        super().__init__(client)
        self.owed = owed
        self.arrivals: list[float] = []

    def forward(self, api: str, body: dict[str, Any]) -> Any:
        started = time.perf_counter()
        with self.lock:
            self.arrivals.append(started)
        try:
            return self.client.forward(api, body)
        finally:
            self.owed.seconds = getattr(self.owed, "seconds", 0.0) + (time.perf_counter() - started)


def agent_main(agent: str, *, rounds: int) -> int:
    envs = Path(tempfile.mkdtemp(prefix="coevo-agent-bench-"))
    try:
        return agent_measure(agent, rounds=rounds, envs=envs)
    finally:
        shutil.rmtree(envs, ignore_errors=True)  # mini-swe-agent's is 655 MiB, Aider's 661


def agent_measure(agent: str, *, rounds: int, envs: Path) -> int:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="coevo.settings",
        COEVO_HARNESS_ENV_DIR=str(envs),  # fresh: the first build is cold
        COEVO_HARNESS_ENV_MAX_BYTES=str(4 * 1024**3),
        COEVO_HARNESS_NPM_REGISTRY="http://127.0.0.1:9/",  # never online: the local cache
    )
    os.environ.setdefault("COEVO_HARNESS_FIND_LINKS", str(REPO / "var" / "wheelhouse"))
    os.environ.setdefault("COEVO_HARNESS_NPM_CACHE", str(REPO / "var" / "npm-cache"))
    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from coevo.policies.client import PolicyClient
    from tests.examples.test_workspace_agents import INPUTS, VERIFIER
    from tests.support.openai_server import ScriptedOpenAIServer
    from workers import boundary
    from workers.environments import workspace as ws_env
    from workers.harness_env import harness_env_prepare
    from workers.outcomes import RolloutOutcome
    from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

    # The boundary's own time per model call: the handler's whole request, less the policy
    # client's share, which AgentTimedPolicy charges to the same thread.
    owed = threading.local()
    own: list[float] = []
    do_post = boundary._Handler.do_POST

    def timed_do_post(handler: Any) -> None:
        owed.seconds = 0.0
        started = time.perf_counter()
        try:
            do_post(handler)
        finally:
            if handler.path.split("?")[0].rstrip("/") in MODEL_CALL_PATHS:
                own.append(time.perf_counter() - started - owed.seconds)

    boundary._Handler.do_POST = timed_do_post

    harness = REPO / "examples" / agent
    load_before = os.getloadavg()
    with harness_env_prepare(harness_dir=harness) as env:
        assert env.built and env.path is not None, env
        cold = env.seconds
        warm = []
        for _ in range(20):
            with harness_env_prepare(harness_dir=harness) as again:
                warm.append(again.seconds)
        walls: list[float] = []
        firsts: list[float] = []
        calls: list[int] = []
        for round_ in range(rounds):
            with ScriptedOpenAIServer(agent_script(agent)) as server:
                policy = AgentTimedPolicy(
                    PolicyClient(server.url, model="scripted", retries=0), owed
                )
                inputs = RolloutInputs(
                    harness_dir=harness,
                    task_key="fix-greeting",
                    task_view=ws_env.harness_view(INPUTS),
                    knob_overrides={},
                    seed=round_,
                    wall_time_s=300,
                    policy_version="bench",
                    harness_env=env.path,
                )
                environment = TaskEnvironment(
                    adapter=ws_env.WorkspaceEnvironment(), inputs=INPUTS, verifier=VERIFIER
                )
                started = time.perf_counter()
                with policy.client:
                    result = execute_rollout(inputs, policy=policy, environment=environment)
                walls.append(time.perf_counter() - started)
            if (result.outcome, result.score) != (RolloutOutcome.PASSED, 1.0):
                print(f"round {round_}: {result.outcome} {result.detail}", file=sys.stderr)
                return 1
            firsts.append(policy.arrivals[0] - started)
            calls.append(len(policy.arrivals))
    load_after = os.getloadavg()

    def s(values: list[float]) -> str:
        return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s"

    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(
        f"{agent}: dependency build cold {cold:.2f} s, warm median "
        f"{statistics.median(warm) * 1000:.2f} ms (max {max(warm) * 1000:.2f} ms) of 20"
    )
    print(f"{rounds} scripted rollouts ({calls} model calls), each passed:")
    print(f"  to the first model call:  {s(firsts)}")
    print(f"  the whole rollout:        {s(walls)}")
    print(f"  the boundary's own time per model call ({len(own)} calls): {ms(own)}")
    return 0


def ms(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50) * 1000:7.3f} ms   "
        f"p95 {percentile(values, 95) * 1000:7.3f} ms   "
        f"mean {statistics.mean(values) * 1000:7.3f} ms"
    )


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))}), {model or 'unknown CPU'}, "
        f"{platform.machine()}, Python {platform.python_version()}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
