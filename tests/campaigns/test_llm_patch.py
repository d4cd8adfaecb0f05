"""The llm-patch proposer against a scripted proposer server, with a real worker: one good
patch is evaluated, each broken kind is rejected at its stage with its reason, and no invalid
proposal reaches evaluation. The proposer model is reached only through a registered policy
endpoint: never a URL a campaign's author typed."""

from __future__ import annotations

import json
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevo.campaigns.models import Campaign, CampaignState, ProposalState, ProposerKind
from coevo.campaigns.proposers import strategy_validate
from coevo.campaigns.proposers.llm_patch import LlmPatchProposer
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.errors import InvalidInput
from coevo.evaluations.models import Evaluation, TraceStep
from harness_store.manifest import parse_manifest
from harness_store.selectors import candidate_read_file
from tests.campaigns.support import MARKER, drive, marked_suite, proposer_endpoint, styled_seed
from tests.conftest import wait_until_final
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy


class QueuedProposer(ScriptedPolicy):
    """Answers with the next scripted text, whatever the prompt (a proposer model's turns)."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__()
        self.answers = list(answers)

    def reply_for(self, text: str) -> str:
        return self.answers.pop(0) if self.answers else "HYPOTHESIS: nothing left"


def block(path: str, search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH {path}\n{search}=======\n{replace}>>>>>>> REPLACE\n"


STYLE_LINE = '    prompt = "style=" + ctx.knobs["style"] + " " + task["input"]\n'
ANSWERS = [
    # 1 malformed: no hypothesis, no edit
    "I think the prompt could be better.",
    # 2 outside the components
    "HYPOTHESIS: notes help\n" + block("notes.txt", "", "remember\n"),
    # 3 invalid manifest
    "HYPOTHESIS: hotter\n"
    + block("harness.toml", "default = 0.0\nmin = 0.0\n", "default = 5.0\nmin = 0.0\n"),
    # 4 does not import
    "HYPOTHESIS: broken\n" + block("agent.py", STYLE_LINE, "    prompt = (\n"),
    # 5 no-op: the same tree as the seed
    "HYPOTHESIS: same\n" + block("agent.py", STYLE_LINE, STYLE_LINE),
    # 6 crashes at run time
    "HYPOTHESIS: crash\n" + block("agent.py", STYLE_LINE, '    raise RuntimeError("boom")\n'),
    # 7 good: always the good style
    "HYPOTHESIS: the good style answers right\n```\n"
    + block("agent.py", STYLE_LINE, '    prompt = "style=good " + task["input"]\n')
    + "```\n",
]
EXPECTED = [
    ("applies", "no 'HYPOTHESIS: ...' line"),
    ("applies", "'notes.txt' is outside the declared components"),
    ("manifest", "outside [0.0, 1.0]"),
    ("imports", "SyntaxError"),
    ("duplicate", "the same tree as candidate"),
    ("smoke", "RuntimeError"),
]


@pytest.fixture
def proposer_server():
    policy = QueuedProposer(ANSWERS)
    policy.model = "proposer-model"
    # Its tokenizer route is asked to count each workspace: one more way out for sealed data.
    policy.flavor = "llama-cpp-python"
    with ScriptedOpenAIServer(policy) as server:
        policy.url = server.url
        proposer_endpoint(server.url)
        yield policy


def test_it_validates_each_patch_and_evaluates_only_the_good_one(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy, proposer_server
):
    from coevo.evaluations.services import evaluation_create

    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    # Held-out material exists (a promotion-style evaluation of the seed) and must stay unseen.
    heldout = evaluation_create(
        candidate=seed, suite=suite, split="heldout", policy_version=policy_version,
        purpose="promotion",
    )  # fmt: skip
    campaign = campaign_create(
        project=project,
        name="llm",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[
            {
                "kind": "llm-patch",
                "options": {
                    "endpoint": "proposer",
                    "model": "proposer-model",
                    "answer_format": "text",
                },
            }
        ],
        max_proposals=len(ANSWERS),
    )
    campaign_start(campaign=campaign)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason

    proposals = list(campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence"))
    assert [p.kind for p in proposals] == [ProposerKind.LLM_PATCH] * len(ANSWERS)
    for p, (stage_name, reason) in zip(proposals, EXPECTED, strict=False):
        failed = next(s for s in p.stages if not s["ok"])
        assert (p.state, failed["stage"]) == (ProposalState.INVALID, stage_name), p.stages
        assert reason in failed["reason"], failed
        assert p.validation_evaluation_id is None
        if stage_name != "smoke":
            assert p.search_evaluation_id is None
            if stage_name in ("imports",):
                # The commit exists (its import was checked) but was never evaluated.
                assert not Evaluation.objects.filter(candidate=p.candidate).exists()
    assert [s["stage"] for s in proposals[3].stages] == ["applies", "manifest", "imports"]
    assert [s["stage"] for s in proposals[5].stages] == [
        "applies", "manifest", "imports", "duplicate", "smoke",
    ]  # fmt: skip

    good = proposals[6]
    assert good.state == ProposalState.EVALUATED, (good.stages, good.state_detail)
    assert [s["stage"] for s in good.stages] == [
        "applies", "manifest", "imports", "duplicate", "smoke",
    ]  # fmt: skip
    assert all(s["ok"] for s in good.stages)
    assert good.search_score == 1.0 and good.validation_score == 1.0
    assert campaign.best_candidate_id == good.candidate_id
    assert good.candidate.message.startswith("llm-patch: the good style answers right")
    assert good.params["hypothesis"] == "the good style answers right"
    assert good.candidate.parent_shas == [seed.sha]
    assert '+    prompt = "style=good " + task["input"]' in good.patch
    assert good.response == ANSWERS[6]
    assert good.proposer_tokens > 0 and good.params["usage"]["completion_tokens"] > 0
    # The workspace showed the seed's code and its failed search traces; the policy's budget
    # was not charged for the proposer's tokens.
    assert STYLE_LINE.strip() in good.prompt
    assert "[model said] no" in good.prompt and good.shown["trace_ids"]
    assert "#6 llm-patch" in good.prompt and "RuntimeError" in good.prompt

    # The seal: validation and held-out inputs and traces hold the marker; no proposer input does.
    wait_until_final(heldout)
    assert TraceStep.objects.filter(
        rollout__task__split="validation", payload__icontains=MARKER
    ).exists()
    assert TraceStep.objects.filter(
        rollout__task__split="heldout", payload__icontains=MARKER
    ).exists()
    assert len(proposer_server.requests) == len(ANSWERS)
    for p in proposals:
        assert MARKER not in json.dumps([p.prompt, p.shown])
    for request in proposer_server.requests:
        assert MARKER not in json.dumps(request)
    assert proposer_server.probes  # the workspaces were counted by the server's tokenizer
    for probe in proposer_server.probes:
        assert MARKER not in json.dumps(probe)


def _manifest(seed):
    return parse_manifest(
        tomllib.loads(candidate_read_file(candidate=seed, path="harness.toml").decode())
    )


def test_it_validates_llm_patch_options(project, tmp_path):
    manifest = _manifest(styled_seed(project, tmp_path))
    proposer_endpoint("http://x:1/v1", name="big-model")
    cleaned = strategy_validate(
        strategy=[{"kind": "llm-patch", "options": {"endpoint": "big-model", "api": "chat"}}],
        manifest=manifest,
        project=project,
    )
    assert cleaned[0]["options"]["api"] == "chat"
    assert cleaned[0]["options"]["endpoint"] == "big-model"
    assert cleaned[0]["options"]["max_tokens"] == 1024
    # A registered endpoint's URL is still accepted (clients written before endpoint names),
    # and stored as the endpoint's name.
    [entry] = strategy_validate(
        strategy=[{"kind": "llm-patch", "options": {"base_url": "http://x:1"}}],
        manifest=manifest,
        project=project,
    )
    assert entry["options"]["endpoint"] == "big-model" and "base_url" not in entry["options"]
    for options, message in (
        ({"api": "rest"}, "api must be one of"),
        ({"temperature": 3}, "temperature must be between"),
        ({"base_url": "ftp://x"}, "not the URL of a registered policy endpoint"),
        ({"endpoint": "nope"}, "'nope' is not a registered policy endpoint.*big-model"),
        ({"endpoint": "big-model", "base_url": "http://x:1/v1"}, "not both"),
        ({"nope": 1}, "unknown options"),
        ({"parent": "random"}, "parent must be one of"),
    ):
        with pytest.raises(InvalidInput, match=message):
            strategy_validate(
                strategy=[{"kind": "llm-patch", "options": options}],
                manifest=manifest,
                project=project,
            )
    with pytest.raises(InvalidInput, match="manual candidates are submitted"):
        strategy_validate(strategy=[{"kind": "manual"}], manifest=manifest, project=project)


def test_it_asks_the_policy_endpoint_by_default_and_records_what_it_sent(
    project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.default = "Let me think about the harness."
    seed = styled_seed(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="defaults",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[{"kind": "llm-patch", "options": {"max_tokens": 64}}],
    )
    options = campaign.strategy[0]["options"]
    assert "endpoint" not in options and "model" not in options

    draft = LlmPatchProposer(campaign, options).propose(history=[])

    request = scripted_policy.requests[-1]
    assert request["path"] == "/v1/completions"
    assert request["model"] == policy_version.served_name and request["max_tokens"] == 64
    assert request["prompt"] == draft.prompt and STYLE_LINE.strip() in draft.prompt
    assert draft.response == "Let me think about the harness."
    # The scripted server counts words: the prompt's and the answer's, both recorded.
    assert draft.proposer_tokens == len(draft.prompt.split()) + len(draft.response.split())
    assert draft.failed and draft.stages[0]["stage"] == "applies"
    assert "no 'HYPOTHESIS: ...' line" in draft.stages[0]["reason"]
    assert draft.changes == {} and draft.parents == [seed]


@pytest.mark.django_db(transaction=True)
def test_it_records_a_model_reply_holding_characters_the_database_refuses(
    project, tmp_path, policy_version, scripted_policy
):
    # A NUL in the hypothesis (the commit message, params), the reply and the patch: PostgreSQL
    # text and jsonb refuse it, and the proposal's write used to fail, draft after draft.
    scripted_policy.default = "HYPOTHESIS: the good\u0000 style\n" + block(
        "agent.py", STYLE_LINE, '    prompt = "style=good " + task["input"]  # \u0000\n'
    )
    campaign = campaign_create(
        project=project,
        name="nul",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[{"kind": "llm-patch", "options": {"answer_format": "text"}}],
        max_proposals=1,
    )
    campaign_start(campaign=campaign)
    drive(campaign, lambda proposal: False)

    proposal = campaign.proposals.get(sequence=1)
    assert proposal.params["hypothesis"] == "the good\ufffd style"
    assert proposal.candidate.message.startswith("llm-patch: the good\ufffd style\n")
    assert proposal.response == scripted_policy.default.replace("\u0000", "\ufffd")
    assert '+    prompt = "style=good " + task["input"]  # \ufffd' in proposal.patch
    # Python refuses a source file with a NUL: rejected at its stage, and recorded.
    assert proposal.state == ProposalState.INVALID
    assert [s["stage"] for s in proposal.stages] == ["applies", "manifest", "imports"]


# --- the proposer model is reached only through a registered endpoint (SSRF) -------------------

SECRET = "redis_version:7.2.4 requirepass=hunter2"


class Listener:
    """Any HTTP service on the worker's network a campaign's author might aim the proposer at
    (Redis, the metadata service, an admin page): records each request, answers ``status``."""

    def __init__(self, status: int = 200, body: bytes = b"{}") -> None:
        listener = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.requests.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture
def start(project, tmp_path, policy_version):
    """Creates an llm-patch campaign with the given options (one seed and suite per test)."""
    seed, suite = styled_seed(project, tmp_path), marked_suite(project)

    def start(options: dict, *, name: str = "llm") -> Campaign:
        return campaign_create(
            project=project,
            name=name,
            seed_candidate=seed,
            policy_version=policy_version,
            suite=suite,
            strategy=[{"kind": "llm-patch", "options": options}],
        )

    return start


def test_it_refuses_a_base_url_that_is_no_registered_endpoint(start, listener):
    for url in ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379", listener.url):
        with pytest.raises(InvalidInput, match="not the URL of a registered policy endpoint"):
            start({"base_url": url})
    assert not Campaign.objects.exists()
    assert listener.requests == []


def test_the_worker_sends_nothing_to_an_endpoint_that_is_not_registered(start, listener):
    campaign = start({})
    # Stored before endpoints were named, with a URL no endpoint has (or edited in the DB).
    legacy = {**campaign.strategy[0]["options"], "base_url": listener.url}
    Campaign.objects.filter(pk=campaign.pk).update(
        strategy=[{"kind": "llm-patch", "options": legacy}]
    )
    campaign.refresh_from_db()
    draft = LlmPatchProposer(campaign, campaign.strategy[0]["options"]).propose(history=[])
    assert draft.failed and draft.changes == {}
    assert "not the URL of a registered policy endpoint" in draft.stages[0]["reason"]
    assert "No request was sent" in draft.stages[0]["reason"]

    # Registered when the campaign started, removed since: the worker checks again.
    endpoint = proposer_endpoint(listener.url, name="gone")
    second = start({"endpoint": "gone"}, name="llm 2")
    endpoint.delete()
    draft = LlmPatchProposer(second, second.strategy[0]["options"]).propose(history=[])
    assert (
        draft.failed and "'gone' is not a registered policy endpoint" in draft.stages[0]["reason"]
    )
    assert listener.requests == []


def test_it_shows_members_no_part_of_a_refusing_reply(start):
    refusing = Listener(400, json.dumps({"error": {"message": SECRET}}).encode())
    try:
        proposer_endpoint(refusing.url)
        # A registered endpoint's URL, as clients written before endpoint names send it.
        campaign = start({"base_url": refusing.url})
        draft = LlmPatchProposer(campaign, campaign.strategy[0]["options"]).propose(history=[])
    finally:
        refusing.close()
    # One model request (the probes of what the server is and how long its context is are
    # the registered endpoint's too).
    assert refusing.requests.count("/v1/completions") == 1
    [refused] = draft.stages
    assert not refused["ok"] and "HTTP 400" in refused["reason"]
    assert "workspace_chars" in refused["reason"]  # what the status usually means, and the fix
    assert "hunter2" not in json.dumps([draft.stages, draft.params, draft.response])
    assert draft.params["endpoint"] == "proposer"  # recorded by name, the URL stays unshown
