"""One rollout: a candidate's harness on one task, mediated and recorded by the worker.

The harness runs in the sandbox and talks JSON lines over stdin/stdout. Every model call it
asks for is made here (so it is recorded, counted against the manifest's limits, and made with
explicit sampling parameters); the answer is scored here by the suite's verifier.

Outcomes: ``passed`` / ``task_failure`` (scored), ``harness_error`` (the candidate crashed,
timed out, broke the protocol or a limit: counts against it), ``infra_error`` (the policy
server or the sandbox failed: retried by the caller, never a score).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.errors import (
    InvalidManifest,
    PolicyRequestRejected,
    PolicyUnavailable,
    SandboxUnavailable,
)
from coevo.evaluations.models import Outcome
from coevo.policies.client import PolicyClient, Sampling
from workers import sandbox
from workers.manifest import Manifest, load_manifest

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_STDOUT_BYTES = 32 * 1024 * 1024
STDERR_TAIL_BYTES = 16 * 1024
MAX_SAMPLES = 16


@dataclass
class Step:
    kind: str
    payload: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0


@dataclass
class RolloutResult:
    outcome: str
    score: float | None
    detail: str = ""
    answer: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    steps: list[Step] = field(default_factory=list)


class _HarnessError(Exception):
    pass


@dataclass
class RolloutInputs:
    harness_dir: Path
    task_key: str
    task_view: dict[str, Any]
    knob_overrides: dict[str, Any]
    seed: int
    wall_time_s: int


def execute_rollout(
    inputs: RolloutInputs,
    *,
    policy: PolicyClient,
    verify: Callable[[Any], Any],
    on_step: Callable[[Step], None] | None = None,
) -> RolloutResult:
    """Run the harness on one task and score its answer. Never raises for harness faults."""
    runner = _Runner(inputs, policy=policy, on_step=on_step)
    return runner.run(verify)


class _Runner:
    def __init__(
        self,
        inputs: RolloutInputs,
        *,
        policy: PolicyClient,
        on_step: Callable[[Step], None] | None,
    ) -> None:
        self.inputs = inputs
        self.policy = policy
        self.on_step = on_step
        self.result = RolloutResult(outcome=Outcome.HARNESS_ERROR, score=0.0)
        self.stderr_tail = bytearray()

    def record(self, step: Step) -> None:
        self.result.steps.append(step)
        if self.on_step:
            self.on_step(step)

    def run(self, verify: Callable[[Any], Any]) -> RolloutResult:
        try:
            manifest = load_manifest(self.inputs.harness_dir)
            knobs = manifest.knob_values(self.inputs.knob_overrides)
        except InvalidManifest as exc:
            return self._end(Outcome.HARNESS_ERROR, f"invalid harness: {exc}")
        self.record(
            Step(
                "start",
                {
                    "task": self.inputs.task_key,
                    "knobs": knobs,
                    "entrypoint": manifest.entrypoint,
                    "seed": self.inputs.seed,
                },
            )
        )
        try:
            answer = self._converse(manifest, knobs)
        except _HarnessError as exc:
            return self._end(Outcome.HARNESS_ERROR, str(exc))
        except (PolicyUnavailable, SandboxUnavailable) as exc:
            return self._end(Outcome.INFRA_ERROR, str(exc), score=None)
        except PolicyRequestRejected as exc:
            # A 4xx from the policy server means the harness asked for something invalid
            # (say, a prompt longer than the context window).
            return self._end(Outcome.HARNESS_ERROR, str(exc))
        self.result.answer = answer
        self.record(Step("answer", {"answer": answer}))
        try:
            verdict = verify(answer)
        except SandboxUnavailable as exc:
            return self._end(Outcome.INFRA_ERROR, str(exc), score=None)
        self.record(
            Step(
                "verdict",
                {
                    "passed": verdict.passed,
                    "score": verdict.score,
                    "detail": verdict.detail,
                    "output": verdict.output[-4000:],
                },
            )
        )
        outcome = Outcome.PASSED if verdict.passed else Outcome.TASK_FAILURE
        return self._end(outcome, verdict.detail, score=verdict.score, record=False)

    def _end(
        self, outcome: str, detail: str, *, score: float | None = 0.0, record: bool = True
    ) -> RolloutResult:
        self.result.outcome = outcome
        self.result.detail = detail
        self.result.score = score
        if record:
            payload: dict[str, Any] = {"outcome": outcome, "message": detail}
            if self.stderr_tail:
                payload["stderr"] = self.stderr_tail.decode(errors="replace")
            self.record(Step("error", payload))
        return self.result

    # --- the conversation with the sandboxed harness ----------------------------------------

    def _converse(self, manifest: Manifest, knobs: dict[str, Any]) -> Any:
        wall_s = min(manifest.limits.wall_time_s, self.inputs.wall_time_s)
        deadline = time.monotonic() + wall_s
        proc = sandbox.spawn(
            [sandbox.python_executable(), "-s", "-m", "coevo_runtime"],
            ro_binds={RUNTIME_DIR: "/opt/coevo", self.inputs.harness_dir.resolve(): "/harness"},
            env={"PYTHONPATH": "/opt/coevo"},
            cwd="/harness",
            limits=sandbox.SandboxLimits(cpu_s=wall_s + 5),
        )
        # Enforced from a timer too, so that nothing this thread blocks on (a reply the harness
        # never reads, say) can hold the rollout past its wall time.
        self._wall_expired = False
        killer = threading.Timer(wall_s, self._expire, args=(proc,))
        killer.daemon = True
        killer.start()
        lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._pump_stdout, args=(proc, lines), daemon=True).start()
        stderr_thread = threading.Thread(target=self._pump_stderr, args=(proc,), daemon=True)
        stderr_thread.start()
        self._stderr_thread = stderr_thread
        try:
            self._send(
                proc,
                {
                    "type": "start",
                    "entrypoint": manifest.entrypoint,
                    "task": self.inputs.task_view,
                    "knobs": knobs,
                },
            )
            calls = 0
            tokens = 0
            while True:
                message = self._next_message(proc, lines, deadline, wall_s)
                kind = message.get("type")
                if kind == "ready":
                    continue
                if kind == "log":
                    self.record(Step("log", {"message": str(message.get("message", ""))[:10000]}))
                elif kind == "answer":
                    return message.get("answer")
                elif kind == "error":
                    stderr_thread.join(timeout=1)
                    detail = message.get("traceback") or ""
                    self.record(
                        Step(
                            "harness_exception",
                            {"error": message.get("error"), "traceback": detail[-8000:]},
                        )
                    )
                    raise _HarnessError(f"the harness raised {message.get('error')}")
                elif kind == "call":
                    reply, calls, tokens = self._handle_call(message, manifest, calls, tokens)
                    self._send(proc, reply)
                else:
                    raise _HarnessError(f"protocol violation: unknown message type {kind!r}")
        finally:
            killer.cancel()
            sandbox.terminate(proc)
            stderr_thread.join(timeout=2)

    def _expire(self, proc: Any) -> None:
        self._wall_expired = True
        sandbox.terminate(proc)

    def _handle_call(
        self, message: dict[str, Any], manifest: Manifest, calls: int, tokens: int
    ) -> tuple[dict[str, Any], int, int]:
        method = message.get("method")
        params = message.get("params") or {}
        if method != "llm.complete":
            raise _HarnessError(f"protocol violation: unknown call {method!r}")
        if manifest.policy_api != "completions":
            raise _HarnessError(
                "the manifest declares policy_api = 'chat' but the harness called ctx.llm.complete"
            )
        sampling, n, prompt = _parse_completion_params(params, self.inputs.seed + calls)
        texts: list[str] = []
        reasons: list[str | None] = []
        prompt_tokens = completion_tokens = 0
        for i in range(n):
            if calls >= manifest.limits.max_model_calls:
                raise _HarnessError(
                    f"limit exceeded: max_model_calls = {manifest.limits.max_model_calls}"
                )
            if tokens >= manifest.limits.max_tokens:
                raise _HarnessError(f"limit exceeded: max_tokens = {manifest.limits.max_tokens}")
            sample = dataclasses.replace(sampling, seed=sampling.seed + i)
            completion = self.policy.complete(prompt, sample)
            calls += 1
            tokens += completion.prompt_tokens + completion.completion_tokens
            self.result.model_calls += 1
            self.result.prompt_tokens += completion.prompt_tokens
            self.result.completion_tokens += completion.completion_tokens
            self.record(
                Step(
                    "model_call",
                    {
                        "api": "completions",
                        "model": completion.model,
                        "prompt": prompt,
                        "sampling": sample.as_params(),
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                    },
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_ms=completion.latency_ms,
                )
            )
            texts.append(completion.text)
            reasons.append(completion.finish_reason)
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
        result = {
            "texts": texts,
            "finish_reasons": reasons,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
        }
        return {"type": "reply", "id": message.get("id"), "result": result}, calls, tokens

    def _send(self, proc: Any, message: dict[str, Any]) -> None:
        try:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            # The harness is gone; _next_message reports how it ended.
            pass

    def _next_message(
        self, proc: Any, lines: queue.Queue[bytes | None], deadline: float, wall_s: int
    ) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _HarnessError(f"limit exceeded: wall time of {wall_s}s")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            raise _HarnessError(f"limit exceeded: wall time of {wall_s}s") from None
        if line is None:
            code = proc.wait()
            if self._wall_expired:
                raise _HarnessError(f"limit exceeded: wall time of {wall_s}s")
            self._stderr_thread.join(timeout=2)
            if self.stderr_tail.startswith(b"bwrap:"):
                raise SandboxUnavailable(
                    f"the sandbox failed to start: {self.stderr_tail.decode(errors='replace')[:500]}"
                )
            if code and code < 0:
                how = f"was killed by signal {-code}"
            else:
                how = f"exited with code {code}"
            raise _HarnessError(f"the harness process {how} before answering")
        if len(line) > MAX_MESSAGE_BYTES:
            raise _HarnessError(
                f"protocol violation: a message on stdout exceeds {MAX_MESSAGE_BYTES} bytes"
            )
        try:
            message = json.loads(line)
        except ValueError:
            raise _HarnessError(
                "protocol violation: the harness wrote non-JSON to stdout "
                f"({line[:120].decode(errors='replace')!r}); stdout is the channel to the worker, "
                "use ctx.log() for messages"
            ) from None
        if not isinstance(message, dict):
            raise _HarnessError("protocol violation: a message on stdout is not a JSON object")
        return message

    def _pump_stdout(self, proc: Any, lines: queue.Queue[bytes | None]) -> None:
        total = 0
        while True:
            line = proc.stdout.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                break
            total += len(line)
            if total > MAX_STDOUT_BYTES:
                lines.put(b"x" * (MAX_MESSAGE_BYTES + 1))
                break
            lines.put(line)
        lines.put(None)

    def _pump_stderr(self, proc: Any) -> None:
        while chunk := proc.stderr.read(4096):
            self.stderr_tail.extend(chunk)
            del self.stderr_tail[:-STDERR_TAIL_BYTES]


def _parse_completion_params(
    params: dict[str, Any], default_seed: int
) -> tuple[Sampling, int, str]:
    prompt = params.get("prompt")
    if not isinstance(prompt, str):
        raise _HarnessError("ctx.llm.complete: prompt must be a string")
    try:
        n = int(params.get("n") or 1)
        stop = params.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        sampling = Sampling(
            max_tokens=int(params.get("max_tokens") or 256),
            temperature=float(params.get("temperature") or 0.0),
            top_p=float(params.get("top_p") if params.get("top_p") is not None else 1.0),
            stop=tuple(str(s) for s in stop),
            seed=int(params["seed"]) if params.get("seed") is not None else default_seed,
        )
    except (TypeError, ValueError) as exc:
        raise _HarnessError(f"ctx.llm.complete: bad sampling parameters: {exc}") from None
    if not 1 <= n <= MAX_SAMPLES:
        raise _HarnessError(f"ctx.llm.complete: n must be between 1 and {MAX_SAMPLES}")
    if sampling.max_tokens < 1:
        raise _HarnessError("ctx.llm.complete: max_tokens must be positive")
    return sampling, n, prompt
