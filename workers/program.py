"""A program harness's rollout: its command in the sandbox, its model calls at the boundary.

The same sandbox, limits and outcomes as a ``run(task, ctx)`` harness (workers/rollout.py
owns the rollout; this is its conversation with a program). The program learns its task and
knobs from files and environment variables, reaches the model only through the rollout's
``ModelBoundary`` (workers/boundary.py), and leaves its answer, as JSON, in
``$COEVO_ANSWER_FILE`` before it exits with status 0. docs/harnesses.md is the contract.

Model calls arrive on the boundary's threads, concurrently. Each is counted against the
manifest's limits under one lock (a slot is taken before the policy is asked, so parallel
calls cannot overrun ``max_model_calls``), recorded with its whole request and reply, and
placed in the rollout's call tree: a call whose conversation extends an earlier call's
(request and reply) is its child; one that repeats an earlier request, or shares only the
start of it, branches off beside it. A call refused for a limit, or one the policy server
cannot answer, ends the rollout (the program is stopped); what the rollout ends as is decided
here, on the worker, never by the program. Once the program has exited the sandbox is killed
at once, with whatever the program left running in it (a daemon holding the socket), and the
boundary answers nothing more: a call still with the policy then changes nothing of the
rollout's result or trace. What the program is told of a refusal never names the policy
server's address (the trace keeps the whole message for the project's members).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coevo.errors import PolicyRequestFailed, PolicyRequestRejected, PolicyUnavailable
from harness_store.manifest import Manifest
from workers import openai_requests
from workers.boundary import BoundaryRefusal, ModelBoundary
from workers.channel import HarnessChannel
from workers.openai_requests import error_body
from workers.outcomes import (
    HarnessExited,
    HarnessFault,
    LimitExceeded,
    ProtocolViolation,
)
from workers.policy import Completion, cost_total, platform_wait, platform_waits_observed
from workers.trace import VIA_BOUNDARY, ModelCall, ProgramOutput, Step

if TYPE_CHECKING:
    from workers.rollout import RolloutRunner

BOUNDARY_DIR = "/run/coevo"
# How often the rollout's thread records the calls the boundary's threads made.
_POLL_S = 0.2
# How long the end of a rollout waits for a helper call to finish once its command is killed.
_HELPER_DRAIN_S = 10.0


def converse_program(runner: RolloutRunner, manifest: Manifest, knobs: dict[str, Any]) -> Any:
    """Run the program to its end and return its answer; raises the fault that ends it."""
    return _ProgramRollout(runner, manifest, knobs).run()


@dataclass
class _CallTree:
    """Where each call sits among the rollout's earlier ones (see the module docstring)."""

    # Hash of (request messages + reply) → call index: a call extending that conversation.
    replies: dict[str, int] = field(default_factory=dict)
    # Hash of a request's messages (or of each of its prefixes) → the first call that sent it.
    requests: dict[str, int] = field(default_factory=dict)
    # Completions: (prompt + completion) per call, for prefix matching.
    texts: list[tuple[str, int]] = field(default_factory=list)
    sessions: dict[int, int] = field(default_factory=dict)

    def place(self, index: int, api: str, request: dict[str, Any], reply: dict[str, Any]) -> dict:
        parent, relation = None, "starts"
        if api == "chat":
            prefixes = _prefix_hashes(request.get("messages") or [])
            full = prefixes[-1]
            for depth in range(len(prefixes) - 1, -1, -1):
                if prefixes[depth] in self.replies:
                    parent, relation = self.replies[prefixes[depth]], "continues"
                    break
            if parent is None:
                for depth in range(len(prefixes) - 1, -1, -1):
                    if prefixes[depth] in self.requests:
                        earlier = self.requests[prefixes[depth]]
                        parent, relation = (
                            earlier,
                            "repeats" if depth == len(prefixes) - 1 else "branches",
                        )
                        break
            for digest in prefixes:
                self.requests.setdefault(digest, index)
            answer = _reply_message(reply)
            if answer is not None:
                self.replies[_extend(full, answer)] = index
        else:
            prompt = request.get("prompt") or ""
            longest = -1
            for text, earlier in self.texts:
                if len(text) > longest and prompt.startswith(text):
                    parent, relation, longest = earlier, "continues", len(text)
            completion = _first_text(reply)
            self.texts.append((prompt + completion, index))
        session = self.sessions.get(parent, index) if parent is not None else index
        self.sessions[index] = session
        return {"call": index, "session": session, "parent": parent, "relation": relation}


class _ProgramRollout:
    def __init__(self, runner: RolloutRunner, manifest: Manifest, knobs: dict[str, Any]) -> None:
        self.runner = runner
        self.manifest = manifest
        self.knobs = knobs
        self.model_name = runner.inputs.policy_version or "policy"
        self.lock = threading.Lock()
        # Environment steps and helpers run one at a time, as ctx.env's do.
        self.env_lock = threading.Lock()
        self.pending: list[Step] = []
        self.fault: HarnessFault | PolicyUnavailable | None = None
        # The program has exited, or the rollout is ending: the boundary refuses every call.
        self.ended = False
        self.calls = 0
        self.tree = _CallTree()
        self.channel: HarnessChannel | None = None
        # The policy's context window for the max_tokens default (asked at most once).
        self.context_lock = threading.Lock()
        self.context_asked = False
        self.context: int | None = None

    # --- the rollout's own thread -----------------------------------------------------------

    def run(self) -> Any:
        runner = self.runner
        assert runner.meter is not None
        # A harness in its task's container finds the socket in the rollout's run directory,
        # bound there when the container started; a sandboxed one gets the directory bound.
        workspace = runner.workspace
        in_container = workspace.boundary_dirs() if workspace is not None else None
        boundary = ModelBoundary(
            handler=self,
            token=secrets.token_urlsafe(32),
            parent=in_container[0] if in_container else None,
        )
        runner.sink = self._queue
        watch: threading.Event | None = None
        try:
            boundary.start()
            options = runner.workspace_channel_options()
            if in_container:
                socket = f"{in_container[1]}/{boundary.socket_dir.name}/{boundary.socket_path.name}"
            else:
                socket = f"{BOUNDARY_DIR}/{boundary.socket_path.name}"
                options["ro_binds"] = {
                    boundary.socket_dir: BOUNDARY_DIR,
                    **options.get("ro_binds", {}),
                }
            self.channel = runner.channel = HarnessChannel(
                harness_dir=runner.inputs.harness_dir,
                wall_s=runner.meter.wall_s,
                deadline=runner.meter.deadline,
                program=True,
                harness_env=runner.inputs.harness_env,
                **options,
            )
            watch = runner.watch_workspace(self.channel)
            self.channel.send(
                {
                    "type": "start",
                    "command": (
                        workspace.harness_command(list(self.manifest.command))
                        if workspace is not None
                        else list(self.manifest.command)
                    ),
                    "task": runner.inputs.task_view,
                    "knobs": self.knobs,
                    "seed": runner.inputs.seed,
                    "token": boundary.token,
                    "socket": socket,
                    "multi_step": runner.multi_step,
                    "helpers": sorted(runner.helpers),
                }
            )
            ended = self._wait_for_the_end()
            return self._answer(ended)
        finally:
            if watch is not None:
                watch.set()
            self._stop()
            if self.channel is not None:
                self.channel.close()
            if runner.workspace is not None:
                # Commands the program started through the exec helper run on the boundary's
                # threads, not in its sandbox: killed here, before anything reads /app back.
                runner.workspace.seal()
            # A helper call that was running has recorded its step by the time it lets go.
            if self.env_lock.acquire(timeout=_HELPER_DRAIN_S):
                self.env_lock.release()
            boundary.close()
            runner.sink = None
            self._drain()

    def _wait_for_the_end(self) -> dict[str, Any]:
        assert self.channel is not None
        while True:
            self._drain()
            try:
                message = self.channel.receive(poll_s=_POLL_S)
            except HarnessFault:
                self._raise_fault()  # the boundary stopped it (a limit, an outage)
                raise
            if message is None:
                continue
            kind = message.get("type")
            if kind == "ready":
                continue
            if kind == "program_ended":
                self._stop()
                self._drain()
                self._raise_fault()
                return message
            raise ProtocolViolation(f"protocol violation: unexpected message {kind!r}")

    def _answer(self, ended: dict[str, Any]) -> Any:
        command = self.manifest.command
        if not ended.get("started"):
            raise HarnessExited(
                f"the harness's command {list(command)!r} could not start: "
                f"{str(ended.get('error'))[:300]}"
            )
        code = ended.get("exit_code")
        tail = str(ended.get("stdout_tail") or "")
        self.runner.record(Step.of(ProgramOutput(exit_code=code, stdout=tail)))
        if code != 0:
            how = (
                f"was killed by signal {-code}"
                if isinstance(code, int) and code < 0
                else f"exited with code {code}"
            )
            raise HarnessExited(f"the program {how}")
        answer = ended.get("answer") or {}
        if not answer.get("written") and (self.runner.multi_step or self.runner.has_workspace):
            # The episode's verdict scores a multi-step suite, the workspace's tests a
            # workspace task: not an answer.
            return None
        if not answer.get("written"):
            raise ProtocolViolation(
                "the program exited without writing its answer to $COEVO_ANSWER_FILE (write "
                'the answer there as JSON, e.g. 42 or "yes", before exiting)'
            )
        if answer.get("too_large"):
            raise LimitExceeded(
                f"limit exceeded: the answer file holds {answer.get('size')} bytes (at most 1 MiB)"
            )
        text = str(answer.get("text") or "")
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise ProtocolViolation(
                f"the answer in $COEVO_ANSWER_FILE is not JSON ({text[:80]!r}); write a JSON "
                'value, e.g. "yes" with its quotes for a string'
            ) from None

    def _queue(self, step: Step) -> None:
        with self.lock:
            self.pending.append(step)

    def _drain(self) -> None:
        with self.lock:
            steps, self.pending = self.pending, []
        for step in steps:
            self.runner.record_now(step)

    def _raise_fault(self) -> None:
        with self.lock:
            fault = self.fault
        if fault is not None:
            raise fault

    def _stop(self) -> None:
        """Refuse the boundary's calls from now on, and kill the sandbox with whatever the
        program left running in it."""
        with self.lock:
            self.ended = True
        if self.channel is not None:
            self.channel.kill()

    def _fail(self, fault: HarnessFault | PolicyUnavailable) -> None:
        """Called under the lock: the rollout ends with ``fault``; stop the program."""
        if self.fault is None:
            self.fault = fault
            if self.channel is not None:
                threading.Thread(target=self.channel.kill, daemon=True).start()

    # --- the boundary's threads (BoundaryHandler) ---------------------------------------------

    def check_request(self, api: str, body: Any) -> tuple[dict[str, Any], list[str]]:
        meter = self.runner.meter
        assert meter is not None
        with self.lock:
            seed = self.runner.inputs.seed + self.calls
            left = meter.limits.max_tokens - meter.tokens
            calls_left = meter.limits.max_model_calls - meter.model_calls
        context = self._context_tokens() if not _names_max_tokens(body) else None
        return openai_requests.check_request(
            api,
            body,
            seed=seed,
            max_tokens_left=left,
            calls_left=calls_left,
            context_tokens=context,
        )

    def _context_tokens(self) -> int | None:
        """The policy's context window, where its server says (asked once per rollout, by the
        first call that needs a max_tokens default; None where it does not say)."""
        with self.context_lock:
            if not self.context_asked:
                self.context_asked = True
                # The policy clients answer server_info (a probe: one try, never raises);
                # a stand-in policy without it leaves the context unknown.
                server_info = getattr(self.runner.policy, "server_info", None)
                # The platform's wait, not the harness's: its wall clock stands still.
                with platform_waits_observed(self.runner), platform_wait():
                    info = server_info() if callable(server_info) else None
                self.context = getattr(info, "context_tokens", None)
            return self.context

    def model_call(
        self, api: str, body: dict[str, Any], *, dropped: list[str], spoken: str | None = None
    ) -> dict[str, Any]:
        runner = self.runner
        meter = runner.meter
        assert meter is not None
        n = int(body.get("n") or 1)
        with self.lock:
            if self.fault is not None or self.ended:
                raise BoundaryRefusal(409, error_body("This rollout has ended.", code="ended"))
            try:
                for _ in range(n):  # a slot per sample, taken before the policy is asked
                    meter.before_model_call()
                    meter.count_model_call(tokens=0)
            except LimitExceeded as exc:
                self._fail(exc)
                raise BoundaryRefusal(429, _limit_body(exc)) from None
            index = self.calls
            self.calls += 1
        try:
            with platform_waits_observed(runner):
                completion = runner.policy.forward(api, body)
        except PolicyUnavailable as exc:
            with self.lock:
                self._fail(exc)
            raise BoundaryRefusal(
                503,
                error_body(
                    "The policy server cannot answer: the rollout ends (an infrastructure "
                    "error, not the harness's).",
                    type="server_error",
                ),
            ) from None
        except PolicyRequestRejected as exc:
            # The request's own fault (a prompt past the context window, say): the program
            # gets the refusal and may recover, as it would from the OpenAI API.
            with self.lock:
                if not self.ended:
                    refused = replace(
                        self._request(api, body, dropped, spoken),
                        call=index,
                        rejected=str(exc)[:2000],
                    )
                    self.pending.append(Step.of(refused))
            status = exc.status if isinstance(exc.status, int) and 400 <= exc.status < 500 else 400
            shown = f"The policy server refused the request (HTTP {exc.status})"
            code = None
            if isinstance(exc, PolicyRequestFailed):
                # A 500 on every try while the server is up: this request is what fails. Told
                # as a 400, which clients do not retry: a 5xx they would send again (each try
                # a model call) to the same failure.
                shown = (
                    f"The policy server failed on this request (HTTP {exc.status} on every try, "
                    "while it is up): change the request"
                )
                code = exc.code
            shown += f": {exc.reply}" if exc.reply else "."
            raise BoundaryRefusal(status, error_body(shown[:2000], code=code)) from None
        reply = dict(completion.raw)
        reply["model"] = self.model_name
        tokens = completion.prompt_tokens + completion.completion_tokens
        with self.lock:
            if self.ended:  # answered after the rollout's end: nothing of it is the rollout's
                raise BoundaryRefusal(409, error_body("This rollout has ended.", code="ended"))
            meter.tokens += tokens
            runner.result.model_calls += n
            runner.result.prompt_tokens += completion.prompt_tokens
            runner.result.completion_tokens += completion.completion_tokens
            runner.result.cost_usd = cost_total([runner.result.cost_usd, completion.cost_usd])
            place = self.tree.place(index, api, body, reply)
            answered = replace(
                self._request(api, body, dropped, spoken, completion),
                **place,
                model=completion.model,
                endpoint=completion.endpoint,
                completion=completion.text,
                finish_reason=completion.finish_reason,
                tool_calls=openai_requests.tool_calls_of(api, reply),
                choices=reply.get("choices"),
                usage=reply.get("usage"),
                cost=completion.cost_record(),
                degraded=_degraded(reply),
            )
            self.pending.append(
                Step.of(
                    answered,
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_ms=completion.latency_ms,
                )
            )
            try:
                meter.check_tokens()
            except LimitExceeded as exc:
                self._fail(exc)
                raise BoundaryRefusal(429, _limit_body(exc)) from None
        return reply

    def coevo_call(self, method: str, params: dict[str, Any]) -> Any:
        """``env.reset``, ``env.step`` or ``helper.<name>`` for a program: the same calls, limits
        and trace steps as ctx.env and ctx.helper (the runner makes them)."""
        with self.env_lock:
            with self.lock:
                if self.fault is not None or self.ended:
                    raise BoundaryRefusal(409, error_body("This rollout has ended.", code="ended"))
            try:
                if method.startswith("env."):
                    return self.runner.env_call(method.removeprefix("env."), params)
                return self.runner.helper_call(method.removeprefix("helper."), params)
            except HarnessFault as exc:
                with self.lock:
                    self._fail(exc)
                status = 429 if isinstance(exc, LimitExceeded) else 400
                raise BoundaryRefusal(
                    status, error_body(str(exc), type="coevo_error", code=str(exc.error_kind))
                ) from None

    def _request(
        self,
        api: str,
        body: dict[str, Any],
        dropped: list[str],
        spoken: str | None = None,
        completion: Completion | None = None,
    ) -> ModelCall:
        """The model-call step's request part; with the ``completion``, the sampling that
        applied (as sent to the endpoint's kind) and what that kind did not take."""
        content_keys = (
            ("messages", "tools", "tool_choice", "response_format")
            if api == "chat"
            else ("prompt",)
        )
        sampling = {k: v for k, v in body.items() if k not in content_keys}
        if completion is not None and completion.sampling:
            sampling = completion.sampling
        if completion is not None and completion.dropped:
            dropped = sorted({*dropped, *completion.dropped})
        return ModelCall(
            api=api,
            via=VIA_BOUNDARY,
            policy_version=self.runner.inputs.policy_version,
            **{key: body[key] for key in content_keys if key in body},
            sampling=sampling,
            n=int(body.get("n") or 1),
            dropped=dropped or None,
            # The harness spoke another API (Anthropic's Messages, OpenAI's Responses); what
            # is recorded is the chat call it was translated to.
            spoken=spoken or None,
        )


def _degraded(reply: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The step's ``degraded`` list, where the policy server named parts of the request it
    could not honour. The reply keeps ``coevo_degraded`` on its way to the program: the
    OpenAI SDKs ignore a field they do not know, and a program that does know it can adapt
    (say, put its tools in the prompt) as the trace's reader would."""
    return openai_requests.degraded_of(reply) or None


def _names_max_tokens(body: Any) -> bool:
    return isinstance(body, dict) and (
        body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None
    )


def _limit_body(exc: LimitExceeded) -> dict[str, Any]:
    return error_body(str(exc), type="coevo_limit", code="limit_exceeded")


def _canonical(message: Any) -> str:
    """A message as sent back by clients that re-serialise it (the openai SDK adds nulls and
    empty lists): role, content, tool calls (id, name, arguments), tool_call_id, name."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    calls = []
    tool_calls = message.get("tool_calls")  # whatever the program sent: not always a list
    for call in tool_calls if isinstance(tool_calls, list) else []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            arguments = _same_json(function.get("arguments"))
            calls.append([call.get("id"), function.get("name"), arguments])
    content = message.get("content")
    return json.dumps(
        [
            message.get("role"),
            content or "",
            calls,
            message.get("tool_call_id"),
            message.get("name"),
        ],
        sort_keys=True,
        default=str,
    )


def _same_json(arguments: Any) -> Any:
    """Tool-call arguments as one spelling of their JSON: a client that parses them (the
    Anthropic SDKs' tool_use ``input``) sends them back in its own spacing."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return arguments


def _prefix_hashes(messages: list[Any]) -> list[str]:
    """Hash of messages[:1], messages[:2], … (each from the one before: linear in the size)."""
    digests, running = [], ""
    for message in messages:
        running = _extend(running, message)
        digests.append(running)
    return digests or [""]


def _extend(running: str, message: Any) -> str:
    return hashlib.sha256((running + _canonical(message)).encode()).hexdigest()


def _reply_message(reply: dict[str, Any]) -> dict[str, Any] | None:
    choices = reply.get("choices") or []
    if choices and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict):
        return choices[0]["message"]
    return None


def _first_text(reply: dict[str, Any]) -> str:
    choices = reply.get("choices") or []
    if choices and isinstance(choices[0], dict):
        return str(choices[0].get("text") or "")
    return ""
