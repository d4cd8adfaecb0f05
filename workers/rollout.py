"""One rollout: a candidate's harness on one task, mediated and recorded by the worker.

The harness runs in the sandbox and talks JSON lines over stdin/stdout. Every model call,
environment step and suite helper it asks for is made here, so each one is recorded in the
trace, counted against the manifest's limits (max_model_calls, max_tokens, max_steps, wall
time: enforced here, never trusted to the harness) and made with explicit parameters. The
answer is scored here by the suite's verifier; on a multi-step suite the score is the
episode's verdict.

Outcomes: ``passed`` / ``task_failure`` (scored), ``harness_error`` (the candidate crashed,
timed out, broke the protocol or a limit: counts against it), ``infra_error`` (the policy
server or the sandbox failed: retried by the caller, never a score). A failure's kind is
decided where it is raised (workers/outcomes.py) and carried on the result.

Beside this module: the channel to the harness process (workers/channel.py), parsing what it
sends (workers/calls.py) and counting it against the limits (workers/limits.py).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from coevo.errors import (
    InvalidManifest,
    PolicyRequestRejected,
    PolicyUnavailable,
    SandboxUnavailable,
)
from harness_store.manifest import Manifest, load_manifest
from workers import calls, openai_requests, trace
from workers.channel import HarnessChannel, harness_binds
from workers.containers import ImageBuildFailed, ImageUnavailable
from workers.environments.base import Environment, Episode, InvalidHelperCall, Verdict
from workers.environments.workspace import MAX_VERIFIER_OUTPUT_CHARS, Workspace
from workers.environments.workspace_files import WorkspaceRefused
from workers.limits import LimitMeter
from workers.outcomes import (
    ErrorKind,
    HarnessFault,
    HarnessRaised,
    InvalidCall,
    LimitExceeded,
    ProtocolViolation,
    RolloutOutcome,
)
from workers.policy import Completion, Policy, Sampling, cost_total, platform_waits_observed
from workers.program import converse_program
from workers.trace import Step


@dataclass
class RolloutResult:
    outcome: str
    score: float | None
    detail: str = ""
    # What went wrong, decided where it went wrong (workers/outcomes.py); "" when scored.
    error_kind: ErrorKind = ErrorKind.NONE
    # An infra_error because the policy server itself was down (PolicyUnavailable's
    # ``endpoint_down``): an outage, so the attempt is not the rollout's to count.
    endpoint_down: bool = False
    answer: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    # US dollars, the sum of its calls' costs; None when no call had a price.
    cost_usd: Decimal | None = None
    steps: list[Step] = field(default_factory=list)


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
    # The harness's built dependencies (workers/harness_env.py), mounted read-only; None when
    # it declares none.
    harness_env: Path | None = None


@dataclass
class TaskEnvironment:
    """The trusted side of one task: its suite kind's environment, the task's inputs and
    verifier data."""

    adapter: Environment
    inputs: dict[str, Any]
    verifier: dict[str, Any]
    # A workspace the caller made and keeps (a proposer reads its final state afterwards);
    # otherwise a workspace environment's rollout makes one from ``inputs`` and removes it.
    workspace: Workspace | None = None

    @property
    def multi_step(self) -> bool:
        return self.adapter.multi_step

    @property
    def has_workspace(self) -> bool:
        return self.adapter.workspace

    @property
    def helpers(self) -> dict[str, Callable[..., dict[str, Any]]]:
        return dict(self.adapter.helpers)

    def verify(self, answer: Any, *, workspace: Workspace | None = None) -> Verdict:
        if self.adapter.workspace:
            return self.adapter.verify(  # type: ignore[call-arg]
                inputs=self.inputs, verifier=self.verifier, answer=answer, workspace=workspace
            )
        return self.adapter.verify(inputs=self.inputs, verifier=self.verifier, answer=answer)

    def wall_s(self) -> int | None:
        """The task's own time limit for the harness (a workspace task's task.toml)."""
        return self.adapter.wall_s(self.inputs)

    def open_episode(self, *, seed: int) -> Episode:
        return self.adapter.open_episode(inputs=self.inputs, verifier=self.verifier, seed=seed)


def execute_rollout(
    inputs: RolloutInputs,
    *,
    policy: Policy,
    environment: TaskEnvironment | None = None,
    verify: Callable[[Any], Any] | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> RolloutResult:
    """Run the harness on one task and score it. Never raises for harness faults.

    ``policy`` answers the harness's model calls (a ``coevo.policies.client`` client, say).
    ``environment`` gives the full suite contract (multi-step episodes, helpers); a bare
    ``verify(answer) -> Verdict`` is enough for a single-answer suite without helpers.
    """
    if (environment is None) == (verify is None):
        raise TypeError("execute_rollout needs exactly one of environment= or verify=")
    runner = RolloutRunner(
        inputs, policy=policy, environment=environment, verify=verify, on_step=on_step
    )
    return runner.run()


class RolloutRunner:
    """One rollout's run: the harness's sandbox (or its task's container), the conversation
    with it, the trace, the limits and the verdict. ``execute_rollout`` makes and runs one.

    The runner of a ``run(task, ctx)`` harness is this class; a program harness's conversation
    (workers/program.py, ``converse_program``) drives the same runner through this interface,
    and nothing else of it:

    - what the rollout is: ``inputs``, ``policy``, ``multi_step``, ``helpers``, ``has_workspace``
      and ``workspace`` (its task's files, or its container);
    - where it stands: ``meter`` (the limits), ``result`` (what it will report), ``channel``
      (the harness process), ``sink`` (where steps go while the program runs);
    - what it does for a program: ``record`` / ``record_now`` (a trace step),
      ``workspace_channel_options`` and ``watch_workspace`` (the harness's sandbox or
      container, and its size watch), ``env_call`` (``ctx.env``) and ``helper_call``
      (``ctx.helper``), each as the boundary's ``/env`` and ``/helpers`` routes answer them.
    """

    def __init__(
        self,
        inputs: RolloutInputs,
        *,
        policy: Policy,
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
        self.sink: Callable[[Step], None] | None = None
        self.result = RolloutResult(outcome=RolloutOutcome.HARNESS_ERROR, score=0.0)
        self.channel: HarnessChannel | None = None
        self.meter: LimitMeter | None = None
        self.episode: Episode | None = None
        self.episode_started = False
        self.episode_done = False
        self.workspace: Workspace | None = None
        # Set by the workspace's watch when it stops the harness for filling it.
        self.workspace_fault: LimitExceeded | None = None
        # Waits for the platform in progress (platform_wait_started), and since when.
        self._pause_lock = threading.Lock()
        self._pauses = 0
        self._paused_at = 0.0

    def record(self, step: Step) -> None:
        """Add a step to the trace. A program harness's calls arrive on the boundary's threads:
        while it runs, ``sink`` takes their steps, and the rollout's own thread records them
        (``record_now``), so that ``on_step`` (the trace writer) only ever runs on one thread."""
        if self.sink is not None:
            self.sink(step)
        else:
            self.record_now(step)

    def record_now(self, step: Step) -> None:
        self.result.steps.append(step)
        if self.on_step:
            self.on_step(step)

    def run(self) -> RolloutResult:
        try:
            manifest = load_manifest(self.inputs.harness_dir)
            knobs = manifest.knob_values(self.inputs.knob_overrides)
        except InvalidManifest as exc:
            return self._end(
                RolloutOutcome.HARNESS_ERROR, ErrorKind.MANIFEST, f"invalid harness: {exc}"
            )
        self.record(
            Step.of(
                trace.Start(
                    task=self.inputs.task_key,
                    knobs=knobs,
                    command=list(manifest.command) if manifest.is_program else None,
                    entrypoint=None if manifest.is_program else manifest.entrypoint,
                    seed=self.inputs.seed,
                    policy_version=self.inputs.policy_version,
                    policy_api=manifest.policy_api,
                    limits=manifest.limits.as_dict(),
                    multi_step=self.multi_step,
                    helpers=sorted(self.helpers),
                    workspace=self.has_workspace,
                )
            )
        )
        try:
            if self.multi_step:
                assert self.environment is not None
                self.episode = self.environment.open_episode(seed=self.inputs.seed)
            if self.has_workspace:
                assert self.environment is not None
                try:
                    # The harness runs in the task's container when the task has one.
                    self.workspace = self.environment.workspace or Workspace.for_task(
                        self.environment.inputs,
                        harness=harness_binds(
                            harness_dir=self.inputs.harness_dir,
                            harness_env=self.inputs.harness_env,
                        ),
                    )
                except (ImageUnavailable, ImageBuildFailed, WorkspaceRefused) as exc:
                    if isinstance(exc, ImageBuildFailed):
                        # Where the build stopped, as data: the worker task records it for the
                        # suite's page (coevo/suites/image_builds.py), the log's last 16 KiB.
                        failed = {
                            "step": exc.step,
                            "line": exc.line,
                            "timed_out": exc.timed_out,
                            "error": str(exc)[:4000],
                            "log": exc.log[-16 * 1024 :],
                        }
                        self.record(
                            Step.of(trace.Environment(backend="container", build_failed=failed))
                        )
                    # The task's container cannot be had: not the harness's doing.
                    return self._end(
                        RolloutOutcome.INFRA_ERROR,
                        ErrorKind.SANDBOX,
                        f"the task's container: {exc}",
                        score=None,
                    )
                if self.workspace.applied:
                    self.record(Step.of(trace.Environment.from_payload(self.workspace.applied)))
            return self._play(manifest, knobs)
        finally:
            if self.episode is not None:
                self.episode.close()
            owned = self.environment is None or self.environment.workspace is None
            if self.workspace is not None:
                # Whoever reads it next (the verifier, a proposer's stages) reads it sealed.
                self.workspace.seal()
                if owned:
                    self.workspace.close()

    @property
    def has_workspace(self) -> bool:
        return bool(self.environment and self.environment.has_workspace)

    def _play(self, manifest: Manifest, knobs: dict[str, Any]) -> RolloutResult:
        try:
            answer = self._converse(manifest, knobs)
        except HarnessFault as exc:
            # When the workspace's watch stopped the harness, that is how it ended.
            fault = self.workspace_fault or exc
            self._record_unscored_verdict()
            self._record_workspace_diff()
            return self._end(RolloutOutcome.HARNESS_ERROR, fault.error_kind, str(fault))
        except PolicyUnavailable as exc:
            self.result.endpoint_down = exc.endpoint_down
            return self._end(RolloutOutcome.INFRA_ERROR, ErrorKind.POLICY, str(exc), score=None)
        except SandboxUnavailable as exc:
            return self._end(RolloutOutcome.INFRA_ERROR, ErrorKind.SANDBOX, str(exc), score=None)
        except PolicyRequestRejected as exc:
            # A 4xx from the policy server means the harness asked for something invalid
            # (say, a prompt longer than the context window); so does a 500 it answers on
            # every try while its health probe says it is up (PolicyRequestFailed).
            self._record_unscored_verdict()
            return self._end(RolloutOutcome.HARNESS_ERROR, ErrorKind.POLICY, str(exc))
        self.result.answer = answer
        self.record(Step.of(trace.Answer(answer=answer)))
        if self.workspace is not None and not self._record_workspace_diff():
            return self._end(
                RolloutOutcome.HARNESS_ERROR,
                ErrorKind.LIMIT,
                f"limit exceeded: {self.workspace_fault}",
            )
        try:
            if self.episode is not None:
                verdict = self.episode.verdict()
            elif self.workspace is not None:
                assert self.environment is not None
                verdict = self.environment.verify(answer, workspace=self.workspace)
            else:
                verdict = self.verify(answer)
        except SandboxUnavailable as exc:
            return self._end(RolloutOutcome.INFRA_ERROR, ErrorKind.SANDBOX, str(exc), score=None)
        # A workspace task's test output is what reviewers read: more of it is kept.
        chars = MAX_VERIFIER_OUTPUT_CHARS if self.workspace is not None else 4000
        self.record(Step.of(_verdict_step(verdict, output_chars=chars)))
        outcome = RolloutOutcome.PASSED if verdict.passed else RolloutOutcome.TASK_FAILURE
        return self._end(outcome, ErrorKind.NONE, verdict.detail, score=verdict.score, record=False)

    def _record_workspace_diff(self) -> bool:
        """The workspace's final state against its starting files, in the trace (also when
        the harness failed: reviewers see what it left). False when it is over its limits."""
        if self.workspace is None:
            return True
        try:
            final = self.workspace.final()
        except WorkspaceRefused as exc:
            self.workspace_fault = LimitExceeded(str(exc))
            self.record(Step.of(trace.WorkspaceDiff(error=str(exc))))
            return False
        self.record(Step.of(trace.WorkspaceDiff.from_payload(self.workspace.diff(final))))
        return True

    def _record_unscored_verdict(self) -> None:
        """Where the episode stood when the harness failed: shown in the trace, never scored
        (a harness_error counts against the candidate as 0)."""
        if self.episode is None or not self.episode_started:
            return
        unscored = dataclasses.replace(_verdict_step(self.episode.verdict()), counted=False)
        self.record(Step.of(unscored))

    def _end(
        self,
        outcome: RolloutOutcome,
        error_kind: ErrorKind,
        detail: str,
        *,
        score: float | None = 0.0,
        record: bool = True,
    ) -> RolloutResult:
        self.result.outcome = outcome
        self.result.error_kind = error_kind
        self.result.detail = detail
        self.result.score = score
        if record:
            stderr = None
            if self.channel is not None and self.channel.stderr_tail:
                stderr = self.channel.stderr_tail.decode(errors="replace")
            self.record(Step.of(trace.Error(outcome=outcome, message=detail, stderr=stderr)))
        return self.result

    # --- the conversation with the sandboxed harness ----------------------------------------

    def _converse(self, manifest: Manifest, knobs: dict[str, Any]) -> Any:
        wall_s = min(manifest.limits.wall_time_s, self.inputs.wall_time_s)
        task_wall_s = self.environment.wall_s() if self.environment else None
        if task_wall_s:
            wall_s = min(wall_s, task_wall_s)
        self.meter = meter = LimitMeter(manifest.limits, wall_s=wall_s)
        if manifest.is_program:
            return converse_program(self, manifest, knobs)
        self.channel = channel = HarnessChannel(
            harness_dir=self.inputs.harness_dir,
            wall_s=wall_s,
            deadline=meter.deadline,
            harness_env=self.inputs.harness_env,
            **self.workspace_channel_options(),
        )
        watch = self.watch_workspace(channel)
        try:
            channel.send(
                {
                    "type": "start",
                    "entrypoint": manifest.entrypoint,
                    "task": self.inputs.task_view,
                    "knobs": knobs,
                    "limits": manifest.limits.as_dict(),
                    "multi_step": self.multi_step,
                    "helpers": sorted(self.helpers),
                }
            )
            while True:
                message = channel.receive()
                kind = message.get("type")
                if kind == "ready":
                    continue
                if kind == "log":
                    meter.count_log()
                    self.record(Step.of(calls.log_step(message)))
                elif kind == "answer":
                    return message.get("answer")
                elif kind == "error":
                    channel.wait_for_stderr(timeout=1)
                    self.record(Step.of(calls.exception_step(message)))
                    raise HarnessRaised(f"the harness raised {message.get('error')}")
                elif kind == "call":
                    result = self._handle_call(message, manifest)
                    channel.send({"type": "reply", "id": message.get("id"), "result": result})
                else:
                    raise ProtocolViolation(f"protocol violation: unknown message type {kind!r}")
        finally:
            watch.set()
            channel.close()

    # --- the workspace of a workspace task --------------------------------------------------

    def workspace_channel_options(self) -> dict[str, Any]:
        if self.workspace is None:
            return {}
        return self.workspace.sandbox_options(harness_env=self.inputs.harness_env)

    def watch_workspace(self, channel: HarnessChannel) -> threading.Event:
        """Past its limits the harness is stopped and the rollout ends as a limit; set the
        returned event to stop watching."""
        if self.workspace is None:
            return threading.Event()

        def stop(fault: LimitExceeded) -> None:
            self.workspace_fault = fault
            channel.kill()

        return self.workspace.watch(stop)

    def _handle_call(self, message: dict[str, Any], manifest: Manifest) -> Any:
        method, params = calls.parse_call(message)
        if method in ("llm.complete", "llm.chat"):
            return self._model_call(method.removeprefix("llm."), params, manifest)
        if method in ("env.reset", "env.step"):
            return self.env_call(method.removeprefix("env."), params)
        if method.startswith("helper."):
            return self.helper_call(method.removeprefix("helper."), params)
        raise ProtocolViolation(f"protocol violation: unknown call {method!r}")

    # --- model calls ------------------------------------------------------------------------

    def _model_call(self, api: str, params: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
        assert self.meter is not None
        meter = self.meter
        name = f"ctx.llm.{api}"
        wanted = "completions" if api == "complete" else "chat"
        if manifest.policy_api != wanted:
            other = "complete" if manifest.policy_api == "completions" else "chat"
            # A call the manifest does not declare breaks the harness's own contract.
            raise ProtocolViolation(
                f"the manifest declares policy_api = '{manifest.policy_api}' but the harness "
                f"called {name}; call ctx.llm.{other} or declare policy_api = '{wanted}' in "
                "harness.toml"
            )
        sampling, n = calls.parse_sampling(
            params, name, default_seed=self.inputs.seed + meter.model_calls, chat=api == "chat"
        )
        if api == "complete":
            request: dict[str, Any] = {"prompt": calls.parse_prompt(params, name)}
        else:
            request = {
                "messages": calls.parse_messages(params, name),
                **calls.parse_chat_options(params, name),
            }
        texts: list[str] = []
        reasons: list[str | None] = []
        sample_tool_calls: list[list[dict[str, str]]] = []
        prompt_tokens = completion_tokens = 0
        model = ""
        for i in range(n):
            meter.before_model_call()
            sample = dataclasses.replace(sampling, seed=sampling.seed + i)
            with platform_waits_observed(self):
                completion = self._ask_policy(request, sample)
            meter.count_model_call(tokens=completion.prompt_tokens + completion.completion_tokens)
            self.result.model_calls += 1
            self.result.prompt_tokens += completion.prompt_tokens
            self.result.completion_tokens += completion.completion_tokens
            self.result.cost_usd = cost_total([self.result.cost_usd, completion.cost_usd])
            # One choice per request (n is drawn as n calls): every call is choice 0's.
            tool_calls = openai_requests.tool_calls_of(wanted, completion.raw)
            # What the policy server could not honour (tools its model never saw): the trace
            # says so; the harness gets what it always gets.
            degraded = openai_requests.degraded_of(completion.raw)
            recorded = trace.ModelCall(
                api=wanted,
                model=completion.model,
                policy_version=self.inputs.policy_version,
                endpoint=completion.endpoint,
                **request,
                # As sent: the endpoint kind's names and neutral values included.
                sampling=completion.sampling or sample.as_params(),
                dropped=list(completion.dropped) if completion.dropped else None,
                sample=i,
                n=n,
                completion=completion.text,
                finish_reason=completion.finish_reason,
                cost=completion.cost_record(),
                tool_calls=tool_calls if "tools" in request or tool_calls else None,
                degraded=degraded or None,
            )
            self.record(
                Step.of(
                    recorded,
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_ms=completion.latency_ms,
                )
            )
            meter.check_tokens()
            texts.append(completion.text)
            reasons.append(completion.finish_reason)
            sample_tool_calls.append([_runtime_tool_call(call) for call in tool_calls])
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            model = completion.model
        return {
            "texts": texts,
            "finish_reasons": reasons,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "model": model,
            "tool_calls": sample_tool_calls,
        }

    # --- waits for the platform (workers.policy.PlatformWaitObserver) -------------------------

    def platform_wait_started(self) -> None:
        """A model call waits for a policy slot: the harness's wall clock stands still until
        every such wait has ended (a program's parallel calls may overlap)."""
        with self._pause_lock:
            self._pauses += 1
            if self._pauses > 1:
                return
            self._paused_at = time.monotonic()
            if self.channel is not None:
                self.channel.pause()

    def platform_wait_ended(self) -> None:
        with self._pause_lock:
            self._pauses -= 1
            if self._pauses:
                return
            if self.meter is not None:
                self.meter.extend(time.monotonic() - self._paused_at)
            if self.channel is not None:
                self.channel.resume()

    def _ask_policy(self, request: dict[str, Any], sampling: Sampling) -> Completion:
        if "prompt" in request:
            return self.policy.complete(request["prompt"], sampling)
        if set(request) == {"messages"}:
            return self.policy.chat(request["messages"], sampling)
        # Tools, tool_choice or response_format: the chat body with them added, as it is.
        options = {k: v for k, v in request.items() if k != "messages"}
        body = {"messages": request["messages"], **sampling.as_params(), **options}
        return self.policy.forward("chat", body)

    # --- environment steps ------------------------------------------------------------------

    def env_call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.meter is not None
        name = f"ctx.env.{method}"
        if self.episode is None:
            raise ProtocolViolation(
                f"protocol violation: {name}() on a single-answer suite (ctx.env exists only "
                "on multi-step suites); return the answer from run(task, ctx) instead"
            )
        if method == "reset":
            calls.parse_reset(params, name)
            observation = self.episode.reset()
            self.episode_started = True
            self.episode_done = False
            self.record(Step.of(trace.EnvReset(observation=observation)))
            return observation
        action = calls.parse_action(params, name)
        if not self.episode_started:
            raise ProtocolViolation(f"protocol violation: {name}() before ctx.env.reset()")
        self.meter.before_env_step()
        if self.episode_done:
            raise ProtocolViolation(
                f"protocol violation: {name}() after the episode ended (done = true); return "
                "from run(task, ctx)"
            )
        started = time.monotonic()
        outcome = self.episode.step(action)
        self.meter.count_env_step()
        done = bool(outcome.done)
        # The last step the manifest allows ends the episode, so that a harness looping
        # `while not done` stops there and is scored; stepping on is a harness_error.
        truncated = not done and self.meter.steps_exhausted
        self.episode_done = done or truncated
        reply = {
            "observation": outcome.observation,
            "reward": float(outcome.reward),
            "done": self.episode_done,
            "truncated": truncated,
        }
        self.record(
            Step.of(
                trace.EnvStep(index=self.meter.env_steps, action=action, **reply),
                latency_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return reply

    # --- suite helpers ----------------------------------------------------------------------

    def helper_call(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.meter is not None and self.environment is not None
        helper = self.helpers.get(name)
        if helper is None:
            offered = ", ".join(sorted(self.helpers)) or "none"
            raise ProtocolViolation(
                f"protocol violation: ctx.helper({name!r}): this suite offers no such helper "
                f"(offered: {offered})"
            )
        remaining = self.meter.remaining_s()
        started = time.monotonic()
        try:
            if self.workspace is not None:
                # A command in the workspace is a step of the task, counted as one; it may
                # take what is left of the wall time.
                self.meter.before_env_step()
                self.meter.count_env_step()
                result = helper(workspace=self.workspace, params=params, timeout_s=remaining)
            else:
                timeout_s = max(1.0, min(float(settings.COEVO_VERIFIER_TIMEOUT_S), remaining))
                result = helper(inputs=self.environment.inputs, params=params, timeout_s=timeout_s)
        except InvalidHelperCall as exc:
            raise InvalidCall(f"ctx.helper({name!r}): {exc}") from None
        self.record(
            Step.of(
                trace.HelperCall(name=name, params=params, result=result),
                latency_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return result


def _runtime_tool_call(call: dict[str, Any]) -> dict[str, str]:
    """A tool call as ``ctx.llm.chat`` returns it: strings, ``arguments`` as the model wrote
    them (a server that sends an object gets it back as JSON)."""
    arguments = call.get("arguments")
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments)
    return {
        "id": str(call.get("id") or ""),
        "name": str(call.get("name") or ""),
        "arguments": arguments,
    }


def _verdict_step(verdict: Verdict, *, output_chars: int = 4000) -> trace.Verdict:
    return trace.Verdict(
        passed=verdict.passed,
        score=verdict.score,
        detail=verdict.detail,
        output=verdict.output[-output_chars:],
    )
