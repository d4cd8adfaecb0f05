"""One rollout: a candidate's harness on one task, mediated and recorded by the worker.

The harness runs in the sandbox and talks JSON lines over stdin/stdout. Every model call,
environment step and suite helper it asks for is made here, so each one is recorded in the
trace, counted against the manifest's limits (max_model_calls, max_tokens, max_steps, wall
time: enforced here, never trusted to the harness) and made with explicit parameters. The
answer is scored here by the suite's verifier; on a multi-step suite the score is the
episode's verdict.

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
from types import ModuleType
from typing import Any

from django.conf import settings

from coevo.errors import (
    InvalidManifest,
    PolicyRequestRejected,
    PolicyUnavailable,
    SandboxUnavailable,
)
from coevo.evaluations.models import Outcome
from coevo.policies.client import Completion, PolicyClient, Sampling
from harness_store.manifest import Manifest, load_manifest
from workers import sandbox
from workers.environments import adapter_helpers, adapter_is_multi_step
from workers.environments.base import Episode, InvalidHelperCall, Verdict

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_STDOUT_BYTES = 32 * 1024 * 1024
STDERR_TAIL_BYTES = 16 * 1024
# A flood of tiny messages would otherwise become millions of trace rows, and a flood on
# stderr would keep the worker reading until the wall time.
MAX_LOG_MESSAGES = 1000
MAX_STDERR_BYTES = 8 * 1024 * 1024
MAX_SAMPLES = 16
MAX_STOPS = 16
MAX_ACTION_CHARS = 4000
MAX_LOG_CHARS = 10000
MAX_FRAMES = 50
CHAT_ROLES = ("system", "user", "assistant")


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
    # The label of the policy version that answers (recorded on every model call).
    policy_version: str = ""


@dataclass
class TaskEnvironment:
    """The trusted side of one task: its suite's adapter, the task's inputs and verifier data."""

    adapter: ModuleType
    inputs: dict[str, Any]
    verifier: dict[str, Any]

    @property
    def multi_step(self) -> bool:
        return adapter_is_multi_step(self.adapter)

    @property
    def helpers(self) -> dict[str, Callable[..., dict[str, Any]]]:
        return adapter_helpers(self.adapter)

    def verify(self, answer: Any) -> Verdict:
        return self.adapter.verify(inputs=self.inputs, verifier=self.verifier, answer=answer)

    def open_episode(self, *, seed: int) -> Episode:
        return self.adapter.open_episode(inputs=self.inputs, verifier=self.verifier, seed=seed)


def execute_rollout(
    inputs: RolloutInputs,
    *,
    policy: PolicyClient,
    environment: TaskEnvironment | None = None,
    verify: Callable[[Any], Any] | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> RolloutResult:
    """Run the harness on one task and score it. Never raises for harness faults.

    ``environment`` gives the full suite contract (multi-step episodes, helpers); a bare
    ``verify(answer) -> Verdict`` is enough for a single-answer suite without helpers.
    """
    if (environment is None) == (verify is None):
        raise TypeError("execute_rollout needs exactly one of environment= or verify=")
    runner = _Runner(inputs, policy=policy, environment=environment, verify=verify, on_step=on_step)
    return runner.run()


class _Runner:
    def __init__(
        self,
        inputs: RolloutInputs,
        *,
        policy: PolicyClient,
        environment: TaskEnvironment | None,
        verify: Callable[[Any], Any] | None,
        on_step: Callable[[Step], None] | None,
    ) -> None:
        self.inputs = inputs
        self.policy = policy
        self.environment = environment
        self.verify = verify or environment.verify  # type: ignore[union-attr]
        self.multi_step = bool(environment and environment.multi_step)
        self.helpers = environment.helpers if environment else {}
        self.on_step = on_step
        self.result = RolloutResult(outcome=Outcome.HARNESS_ERROR, score=0.0)
        self.stderr_tail = bytearray()
        self.episode: Episode | None = None
        self.episode_started = False
        self.episode_done = False
        self.calls = 0
        self.tokens = 0
        self.env_steps = 0
        self.deadline = 0.0
        self.wall_s = 0

    def record(self, step: Step) -> None:
        self.result.steps.append(step)
        if self.on_step:
            self.on_step(step)

    def run(self) -> RolloutResult:
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
                    "policy_version": self.inputs.policy_version,
                    "policy_api": manifest.policy_api,
                    "limits": manifest.limits.as_dict(),
                    "multi_step": self.multi_step,
                    "helpers": sorted(self.helpers),
                },
            )
        )
        try:
            if self.multi_step:
                assert self.environment is not None
                self.episode = self.environment.open_episode(seed=self.inputs.seed)
            return self._play(manifest, knobs)
        finally:
            if self.episode is not None:
                self.episode.close()

    def _play(self, manifest: Manifest, knobs: dict[str, Any]) -> RolloutResult:
        try:
            answer = self._converse(manifest, knobs)
        except _HarnessError as exc:
            self._record_unscored_verdict()
            return self._end(Outcome.HARNESS_ERROR, str(exc))
        except (PolicyUnavailable, SandboxUnavailable) as exc:
            return self._end(Outcome.INFRA_ERROR, str(exc), score=None)
        except PolicyRequestRejected as exc:
            # A 4xx from the policy server means the harness asked for something invalid
            # (say, a prompt longer than the context window).
            self._record_unscored_verdict()
            return self._end(Outcome.HARNESS_ERROR, str(exc))
        self.result.answer = answer
        self.record(Step("answer", {"answer": answer}))
        try:
            verdict = self.episode.verdict() if self.episode is not None else self.verify(answer)
        except SandboxUnavailable as exc:
            return self._end(Outcome.INFRA_ERROR, str(exc), score=None)
        self.record(Step("verdict", _verdict_payload(verdict)))
        outcome = Outcome.PASSED if verdict.passed else Outcome.TASK_FAILURE
        return self._end(outcome, verdict.detail, score=verdict.score, record=False)

    def _record_unscored_verdict(self) -> None:
        """Where the episode stood when the harness failed: shown in the trace, never scored
        (a harness_error counts against the candidate as 0)."""
        if self.episode is None or not self.episode_started:
            return
        payload = _verdict_payload(self.episode.verdict())
        payload["counted"] = False
        self.record(Step("verdict", payload))

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
        self.wall_s = wall_s = min(manifest.limits.wall_time_s, self.inputs.wall_time_s)
        self.deadline = deadline = time.monotonic() + wall_s
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
        self._stderr_exceeded = False
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
                    "limits": manifest.limits.as_dict(),
                    "multi_step": self.multi_step,
                    "helpers": sorted(self.helpers),
                },
            )
            logged = 0
            while True:
                message = self._next_message(proc, lines, deadline, wall_s)
                kind = message.get("type")
                if kind == "ready":
                    continue
                if kind == "log":
                    logged += 1
                    if logged > MAX_LOG_MESSAGES:
                        raise _HarnessError(
                            f"limit exceeded: more than {MAX_LOG_MESSAGES} ctx.log messages"
                        )
                    self.record(Step("log", _log_payload(message)))
                elif kind == "answer":
                    return message.get("answer")
                elif kind == "error":
                    stderr_thread.join(timeout=1)
                    self.record(Step("harness_exception", _exception_payload(message)))
                    raise _HarnessError(f"the harness raised {message.get('error')}")
                elif kind == "call":
                    result = self._handle_call(message, manifest)
                    self._send(proc, {"type": "reply", "id": message.get("id"), "result": result})
                else:
                    raise _HarnessError(f"protocol violation: unknown message type {kind!r}")
        finally:
            killer.cancel()
            sandbox.terminate(proc)
            stderr_thread.join(timeout=2)

    def _expire(self, proc: Any) -> None:
        self._wall_expired = True
        sandbox.terminate(proc)

    def _handle_call(self, message: dict[str, Any], manifest: Manifest) -> Any:
        method = message.get("method")
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(method, str):
            raise _HarnessError(f"protocol violation: a call without a method name ({method!r})")
        if not isinstance(params, dict):
            raise _HarnessError(f"protocol violation: the params of {method} must be an object")
        if method in ("llm.complete", "llm.chat"):
            return self._model_call(method.removeprefix("llm."), params, manifest)
        if method in ("env.reset", "env.step"):
            return self._env_call(method.removeprefix("env."), params, manifest)
        if method.startswith("helper."):
            return self._helper_call(method.removeprefix("helper."), params)
        raise _HarnessError(f"protocol violation: unknown call {method!r}")

    # --- model calls ------------------------------------------------------------------------

    def _model_call(self, api: str, params: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
        name = f"ctx.llm.{api}"
        wanted = "completions" if api == "complete" else "chat"
        if manifest.policy_api != wanted:
            other = "complete" if manifest.policy_api == "completions" else "chat"
            raise _HarnessError(
                f"the manifest declares policy_api = '{manifest.policy_api}' but the harness "
                f"called {name}; call ctx.llm.{other} or declare policy_api = '{wanted}' in "
                "harness.toml"
            )
        sampling, n = _parse_sampling(params, name, default_seed=self.inputs.seed + self.calls)
        if api == "complete":
            request: dict[str, Any] = {"prompt": _parse_prompt(params, name)}
        else:
            request = {"messages": _parse_messages(params, name)}
        limits = manifest.limits
        texts: list[str] = []
        reasons: list[str | None] = []
        prompt_tokens = completion_tokens = 0
        model = ""
        for i in range(n):
            if self.calls >= limits.max_model_calls:
                raise _HarnessError(f"limit exceeded: max_model_calls = {limits.max_model_calls}")
            if self.tokens >= limits.max_tokens:
                raise _HarnessError(
                    f"limit exceeded: max_tokens = {limits.max_tokens} "
                    f"({self.tokens} tokens used before this call)"
                )
            sample = dataclasses.replace(sampling, seed=sampling.seed + i)
            completion = self._ask_policy(request, sample)
            used = completion.prompt_tokens + completion.completion_tokens
            self.calls += 1
            self.tokens += used
            self.result.model_calls += 1
            self.result.prompt_tokens += completion.prompt_tokens
            self.result.completion_tokens += completion.completion_tokens
            self.record(
                Step(
                    "model_call",
                    {
                        "api": wanted,
                        "model": completion.model,
                        "policy_version": self.inputs.policy_version,
                        "endpoint": completion.endpoint,
                        **request,
                        "sampling": sample.as_params(),
                        "sample": i,
                        "n": n,
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                    },
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_ms=completion.latency_ms,
                )
            )
            if self.tokens > limits.max_tokens:
                raise _HarnessError(
                    f"limit exceeded: max_tokens = {limits.max_tokens} "
                    f"({self.tokens} prompt and completion tokens used)"
                )
            texts.append(completion.text)
            reasons.append(completion.finish_reason)
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            model = completion.model
        return {
            "texts": texts,
            "finish_reasons": reasons,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "model": model,
        }

    def _ask_policy(self, request: dict[str, Any], sampling: Sampling) -> Completion:
        if "prompt" in request:
            return self.policy.complete(request["prompt"], sampling)
        return self.policy.chat(request["messages"], sampling)

    # --- environment steps ------------------------------------------------------------------

    def _env_call(self, method: str, params: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
        name = f"ctx.env.{method}"
        if self.episode is None:
            raise _HarnessError(
                f"protocol violation: {name}() on a single-answer suite (ctx.env exists only "
                "on multi-step suites); return the answer from run(task, ctx) instead"
            )
        if method == "reset":
            if params:
                raise _HarnessError(f"{name}: takes no parameters, got {sorted(params)}")
            observation = self.episode.reset()
            self.episode_started = True
            self.episode_done = False
            self.record(Step("env_reset", {"observation": observation}))
            return observation
        unknown = set(params) - {"action"}
        if unknown:
            raise _HarnessError(f"{name}: unknown parameters {sorted(unknown)}")
        action = params.get("action")
        if not isinstance(action, str):
            raise _HarnessError(f"{name}: action must be a string, got {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise _HarnessError(f"{name}: action is longer than {MAX_ACTION_CHARS} characters")
        if not self.episode_started:
            raise _HarnessError(f"protocol violation: {name}() before ctx.env.reset()")
        max_steps = manifest.limits.max_steps
        if self.env_steps >= max_steps:
            raise _HarnessError(f"limit exceeded: max_steps = {max_steps}")
        if self.episode_done:
            raise _HarnessError(
                f"protocol violation: {name}() after the episode ended (done = true); return "
                "from run(task, ctx)"
            )
        started = time.monotonic()
        outcome = self.episode.step(action)
        self.env_steps += 1
        done = bool(outcome.done)
        # The last step the manifest allows ends the episode, so that a harness looping
        # `while not done` stops there and is scored; stepping on is a harness_error.
        truncated = not done and self.env_steps >= max_steps
        self.episode_done = done or truncated
        reply = {
            "observation": outcome.observation,
            "reward": float(outcome.reward),
            "done": self.episode_done,
            "truncated": truncated,
        }
        self.record(
            Step(
                "env_step",
                {"index": self.env_steps, "action": action, **reply},
                latency_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return reply

    # --- suite helpers ----------------------------------------------------------------------

    def _helper_call(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        helper = self.helpers.get(name)
        if helper is None:
            offered = ", ".join(sorted(self.helpers)) or "none"
            raise _HarnessError(
                f"protocol violation: ctx.helper({name!r}): this suite offers no such helper "
                f"(offered: {offered})"
            )
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _HarnessError(f"limit exceeded: wall time of {self.wall_s}s")
        timeout_s = max(1.0, min(float(settings.COEVO_VERIFIER_TIMEOUT_S), remaining))
        started = time.monotonic()
        try:
            assert self.environment is not None
            result = helper(inputs=self.environment.inputs, params=params, timeout_s=timeout_s)
        except InvalidHelperCall as exc:
            raise _HarnessError(f"ctx.helper({name!r}): {exc}") from None
        self.record(
            Step(
                "helper_call",
                {"name": name, "params": params, "result": result},
                latency_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return result

    # --- the channel ------------------------------------------------------------------------

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
            if self._stderr_exceeded:
                raise _HarnessError(f"limit exceeded: more than {MAX_STDERR_BYTES} bytes on stderr")
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
        except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
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
        total = 0
        while chunk := proc.stderr.read(4096):
            self.stderr_tail.extend(chunk)
            del self.stderr_tail[:-STDERR_TAIL_BYTES]
            total += len(chunk)
            if total > MAX_STDERR_BYTES and not self._stderr_exceeded:
                self._stderr_exceeded = True
                sandbox.terminate(proc)


# --- parsing what the harness sends -----------------------------------------------------------


def _verdict_payload(verdict: Verdict) -> dict[str, Any]:
    return {
        "passed": verdict.passed,
        "score": verdict.score,
        "detail": verdict.detail,
        "output": verdict.output[-4000:],
    }


def _log_payload(message: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {"message": str(message.get("message", ""))[:MAX_LOG_CHARS]}
    fields = message.get("fields")
    if isinstance(fields, dict) and fields:
        text = json.dumps(fields)
        payload["fields"] = fields if len(text) <= MAX_LOG_CHARS else {"truncated": text[:2000]}
    return payload


def _exception_payload(message: dict[str, Any]) -> dict[str, Any]:
    """The harness's error with its traceback text and frames (file relative to the harness
    root, line, function), which the trace viewer links to the candidate's source."""
    frames = []
    raw_frames = message.get("frames")
    for frame in raw_frames[-MAX_FRAMES:] if isinstance(raw_frames, list) else []:
        if not isinstance(frame, dict):
            continue
        line = frame.get("line")
        frames.append(
            {
                "file": str(frame.get("file", ""))[:500],
                "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
                "function": str(frame.get("function", ""))[:200],
                "code": str(frame.get("code", ""))[:500],
                "in_harness": frame.get("in_harness") is True,
            }
        )
    return {
        "error": str(message.get("error", ""))[:2000],
        "traceback": str(message.get("traceback") or "")[-8000:],
        "frames": frames,
    }


def _parse_prompt(params: dict[str, Any], name: str) -> str:
    prompt = params.get("prompt")
    if not isinstance(prompt, str):
        raise _HarnessError(f"{name}: prompt must be a string, got {type(prompt).__name__}")
    return prompt


def _parse_messages(params: dict[str, Any], name: str) -> list[dict[str, str]]:
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _HarnessError(f"{name}: messages must be a non-empty list of {{role, content}}")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _HarnessError(f"{name}: messages[{i}] must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise _HarnessError(
                f"{name}: messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}"
            )
        if not isinstance(content, str):
            raise _HarnessError(
                f"{name}: messages[{i}].content must be a string, got {type(content).__name__}"
            )
        extra = set(message) - {"role", "content"}
        if extra:
            raise _HarnessError(f"{name}: messages[{i}] has unknown keys {sorted(extra)}")
        parsed.append({"role": role, "content": content})
    return parsed


def _parse_sampling(
    params: dict[str, Any], name: str, *, default_seed: int
) -> tuple[Sampling, int]:
    """Sampling parameters, each checked; a bad one ends the rollout naming the call and field."""
    known = {"prompt", "messages", "max_tokens", "temperature", "top_p", "stop", "n", "seed"}
    unknown = set(params) - known
    if unknown:
        raise _HarnessError(f"{name}: unknown parameters {sorted(unknown)}")

    def number(key: str, default: float, *, integer: bool) -> Any:
        value = params.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _HarnessError(f"{name}: {key} must be a number, got {value!r}")
        if integer and not float(value).is_integer():
            raise _HarnessError(f"{name}: {key} must be an integer, got {value!r}")
        return int(value) if integer else float(value)

    max_tokens = number("max_tokens", 256, integer=True)
    temperature = number("temperature", 0.0, integer=False)
    top_p = number("top_p", 1.0, integer=False)
    n = number("n", 1, integer=True)
    seed = number("seed", default_seed, integer=True)
    stop = params.get("stop")
    if stop is None:
        stop = []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _HarnessError(f"{name}: stop must be a list of non-empty strings, got {stop!r}")
    if len(stop) > MAX_STOPS:
        raise _HarnessError(f"{name}: stop has {len(stop)} strings; at most {MAX_STOPS}")
    if max_tokens < 1:
        raise _HarnessError(f"{name}: max_tokens must be positive, got {max_tokens}")
    if not 0.0 <= temperature <= 2.0:
        raise _HarnessError(f"{name}: temperature must be between 0 and 2, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise _HarnessError(f"{name}: top_p must be in (0, 1], got {top_p}")
    if not 1 <= n <= MAX_SAMPLES:
        raise _HarnessError(f"{name}: n must be between 1 and {MAX_SAMPLES}, got {n}")
    sampling = Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=tuple(stop), seed=seed
    )
    return sampling, n
