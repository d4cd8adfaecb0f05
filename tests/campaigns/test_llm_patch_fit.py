"""The llm-patch proposer fits its workspace to the proposer model's context window (read from
the server, else the context_tokens option, else the setting), refuses a prompt that cannot fit
before any request, and asks for a JSON answer the server enforces (a GBNF grammar on
llama.cpp, response_format with a JSON schema on vLLM), falling back to the free-text format
where the server is unknown. The scripted server plays each kind of server; a word is a token."""

from __future__ import annotations

import json

import pytest

from coevo.campaigns.models import Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers import strategy_validate
from coevo.campaigns.proposers.llm_patch import LlmPatchProposer
from coevo.campaigns.selectors import proposer_validity
from coevo.campaigns.services import campaign_create
from coevo.errors import InvalidInput
from tests.campaigns.support import marked_suite, proposer_endpoint, styled_seed
from tests.campaigns.test_llm_patch import STYLE_LINE, QueuedProposer, _manifest, block
from tests.support.openai_server import ScriptedOpenAIServer

GOOD_EDIT = {
    "path": "agent.py",
    "search": STYLE_LINE,
    "replace": '    prompt = "style=good " + task["input"]\n',
}
JSON_ANSWER = json.dumps({"hypothesis": "the good style answers right", "edits": [GOOD_EDIT]})
LONG_PATCH = "".join(
    f"+    line {i} of a long earlier patch that fills the history\n" for i in range(60)
)


@pytest.fixture
def proposer(db):
    """A scripted proposer server registered as the endpoint ``proposer``: set ``flavor`` and
    ``context_tokens`` on it, and queue its answers in ``answers``."""
    policy = QueuedProposer([])
    with ScriptedOpenAIServer(policy) as server:
        proposer_endpoint(server.url)
        yield policy


@pytest.fixture
def propose(project, tmp_path, policy_version):
    """Creates an llm-patch campaign with ``options`` (endpoint ``proposer``) and ``history``
    earlier invalid proposals with long patches, and writes one draft."""
    seed, suite = styled_seed(project, tmp_path), marked_suite(project)
    made = []

    def propose(options: dict, *, history: int = 0):
        campaign = campaign_create(
            project=project,
            name=f"fit {len(made)}",
            seed_candidate=seed,
            policy_version=policy_version,
            suite=suite,
            strategy=[{"kind": "llm-patch", "options": {"endpoint": "proposer", **options}}],
        )
        for sequence in range(1, history + 1):
            Proposal.objects.create(
                campaign=campaign,
                sequence=sequence,
                kind=ProposerKind.LLM_PATCH,
                state=ProposalState.INVALID,
                state_detail=f"applies: proposal {sequence} did not apply",
                patch=LONG_PATCH,
                params={"hypothesis": f"hypothesis number {sequence}"},
            )
        made.append(campaign)
        return LlmPatchProposer(campaign, campaign.strategy[0]["options"]).propose(history=[])

    return propose


def _words(text: str) -> int:
    return len(text.split())


def test_it_reads_vllm_s_context_window_trims_the_oldest_history_and_sends_a_json_schema(
    proposer, propose
):
    proposer.flavor, proposer.context_tokens = "vllm", 1500
    proposer.answers = [JSON_ANSWER]
    draft = propose({"max_tokens": 200}, history=10)

    context = draft.params["context"]
    assert (context["window_tokens"], context["source"]) == (1500, "server")
    assert context["counted_by"] == "server tokenizer"
    assert _words(draft.prompt) == context["prompt_tokens"] <= 1500 - 200 - 32
    # The oldest earlier proposals went first; the newest and the parent's code stayed.
    trimmed = draft.shown["trimmed"]["proposals"]
    assert trimmed and trimmed == sorted(trimmed) and 1 in trimmed and 10 not in trimmed
    assert "hypothesis number 10" in draft.prompt and "hypothesis number 1\n" not in draft.prompt
    assert STYLE_LINE.strip() in draft.prompt
    assert draft.shown["proposals"] == [s for s in range(1, 11) if s not in trimmed]
    # The request passed the server's own context check, with the schema attached.
    [request] = proposer.requests
    assert request["path"] == "/v1/completions" and "grammar" not in request
    response_format = request["response_format"]
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    assert schema["required"] == ["hypothesis", "edits"]
    assert schema["properties"]["edits"]["items"]["properties"]["path"] == {
        "enum": ["agent.py", "harness.toml"]
    }
    assert {p["path"] for p in proposer.probes} == {"/tokenize"}
    # The JSON answer became the edit.
    assert not draft.failed, draft.stages
    assert draft.params["answer_format"] == "json" and draft.params["format"] == "json"
    assert draft.params["enforced_by"] == "response_format"
    assert draft.params["hypothesis"] == "the good style answers right"
    assert b'"style=good "' in draft.changes["agent.py"]
    assert "Answer with one JSON object" in draft.prompt


def test_it_sends_llama_cpp_a_grammar_and_reads_its_context_from_props(proposer, propose):
    proposer.flavor, proposer.context_tokens = "llama.cpp", 2000
    proposer.answers = [JSON_ANSWER]
    draft = propose({"max_tokens": 100, "api": "chat"})

    assert draft.params["context"]["window_tokens"] == 2000
    assert draft.params["server"] == "llama.cpp" and draft.params["enforced_by"] == "grammar"
    # auto on llama.cpp: json-lines, each search one of the file's own unique lines.
    assert draft.params["answer_format"] == "json-lines"
    [request] = proposer.requests
    assert request["path"] == "/v1/chat/completions" and "response_format" not in request
    grammar = request["grammar"]
    assert grammar.startswith("root ::=") and "edit ::= edit0 | edit1" in grammar
    assert json.dumps(STYLE_LINE).replace("\\", "\\\\").replace('"', '\\"') in grammar
    assert "one whole line copied from that file" in draft.prompt
    assert not draft.failed, draft.stages


def test_llama_cpp_python_gets_a_grammar_and_the_setting_s_window(proposer, propose, settings):
    settings.COEVO_PROPOSER_CONTEXT_TOKENS = 1200
    proposer.flavor = "llama-cpp-python"  # it reports no context window
    proposer.answers = [JSON_ANSWER]
    draft = propose({"max_tokens": 64}, history=6)

    context = draft.params["context"]
    assert (context["window_tokens"], context["source"]) == (1200, "setting")
    assert context["counted_by"] == "server tokenizer"
    assert _words(draft.prompt) <= 1200 - 64 - 32
    assert draft.shown["trimmed"]["proposals"]
    assert "/extras/tokenize/count" in {p["path"] for p in proposer.probes}
    assert "grammar" in proposer.requests[0]
    assert not draft.failed, draft.stages


def test_the_context_tokens_option_counts_where_the_server_says_nothing_and_text_is_the_fallback(
    proposer, propose
):
    # An unknown OpenAI-compatible server: no context, no tokenizer, no structured output.
    proposer.answers = [
        "HYPOTHESIS: the good style answers right\n"
        + block("agent.py", STYLE_LINE, '    prompt = "style=good " + task["input"]\n')
    ]
    draft = propose({"max_tokens": 64, "context_tokens": 1500}, history=10)

    context = draft.params["context"]
    assert (context["window_tokens"], context["source"]) == (1500, "option")
    assert context["counted_by"] == "estimate"
    # Three characters a token, the estimate's conservative rate.
    assert len(draft.prompt) <= (1500 - 64 - 32) * 3
    assert draft.shown["trimmed"]["proposals"]
    [request] = proposer.requests
    assert "grammar" not in request and "response_format" not in request
    assert draft.params["answer_format"] == "text" and draft.params["enforced_by"] is None
    assert "HYPOTHESIS: <one line" in draft.prompt
    assert not draft.failed and draft.params["format"] == "search-replace"


def test_an_option_below_the_server_s_window_caps_the_prompt(proposer, propose):
    proposer.flavor, proposer.context_tokens = "vllm", 100_000
    proposer.answers = [JSON_ANSWER]
    draft = propose({"max_tokens": 64, "context_tokens": 1200})
    assert draft.params["context"]["window_tokens"] == 1200
    assert draft.params["context"]["source"] == "option"


def test_it_refuses_a_prompt_that_cannot_fit_before_any_request(proposer, propose):
    # The seed's smallest workspace is some 270 words: 256 are left of 352 (64 answer, 32 margin).
    proposer.flavor, proposer.context_tokens = "vllm", 352
    draft = propose({"max_tokens": 64})

    [refused] = draft.stages
    assert refused["stage"] == "applies" and not refused["ok"]
    reason = refused["reason"]
    assert "cannot fit the proposer's context" in reason
    assert f"{draft.shown['minimum_chars']:,} characters" in reason
    assert "more than the 256 left of the 352-token context (as the server reports it)" in reason
    assert "max_tokens 64" in reason and "No request was sent" in reason
    assert proposer.requests == []  # never asked
    assert draft.proposer_tokens == 0 and draft.changes == {}
    # max_tokens alone too large for the window: the message says which number to lower.
    draft = propose({"max_tokens": 300})
    assert "max_tokens 300 leaves 20 tokens" in draft.stages[0]["reason"]
    assert proposer.requests == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ('{"hypothesis": "cut short", "edits": [{"path": "agent.py", "sea', "not valid JSON"),
        ("I would change the prompt.", "no JSON object"),
        (json.dumps({"hypothesis": "", "edits": [GOOD_EDIT]}), 'no "hypothesis"'),
        (json.dumps({"hypothesis": "h", "edits": []}), 'no "edits"'),
        (json.dumps({"hypothesis": "h", "edits": [{"path": "agent.py"}]}), "edits[0] is not"),
        (
            json.dumps({"hypothesis": "h", "edits": [{**GOOD_EDIT, "path": "notes.txt"}]}),
            "'notes.txt' is outside the declared components",
        ),
        (
            json.dumps({"hypothesis": "h", "edits": [{**GOOD_EDIT, "search": "nowhere\n"}]}),
            "occurs 0 times",
        ),
    ],
)
def test_a_json_answer_that_fails_is_an_invalid_proposal_with_its_reason(
    proposer, propose, answer, reason
):
    proposer.flavor, proposer.context_tokens = "vllm", 8000
    proposer.answers = [answer]
    draft = propose({"max_tokens": 64})
    [failed] = draft.stages
    assert failed["stage"] == "applies" and not failed["ok"]
    assert reason in failed["reason"], failed
    assert draft.response == answer and draft.changes == {}


def test_text_is_asked_for_when_the_option_says_so(proposer, propose):
    proposer.flavor, proposer.context_tokens = "vllm", 8000
    draft = propose({"max_tokens": 64, "answer_format": "text"})
    assert "response_format" not in proposer.requests[0]
    assert draft.params["answer_format"] == "text"
    # The queue is empty: the scripted proposer answers a bare hypothesis.
    assert "no edit found" in draft.stages[0]["reason"]


def test_it_validates_the_context_and_answer_options(project, tmp_path):
    manifest = _manifest(styled_seed(project, tmp_path))
    [entry] = strategy_validate(
        strategy=[{"kind": "llm-patch"}], manifest=manifest, project=project
    )
    assert entry["options"]["answer_format"] == "auto" and "context_tokens" not in entry["options"]
    [entry] = strategy_validate(
        strategy=[
            {"kind": "llm-patch", "options": {"context_tokens": 8192, "answer_format": "json"}}
        ],
        manifest=manifest,
        project=project,
    )
    assert (entry["options"]["context_tokens"], entry["options"]["answer_format"]) == (8192, "json")
    for options, message in (
        ({"context_tokens": 100}, "context_tokens must be between 256"),
        ({"context_tokens": 4096.5}, "context_tokens must be an integer"),
        ({"answer_format": "yaml"}, "answer_format must be one of auto, json, json-lines, text"),
    ):
        with pytest.raises(InvalidInput, match=message):
            strategy_validate(
                strategy=[{"kind": "llm-patch", "options": options}],
                manifest=manifest,
                project=project,
            )


def test_the_valid_share_is_counted_per_proposer_model(project, tmp_path, policy_version):
    seed = styled_seed(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="shares",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[{"kind": "llm-patch"}],
    )
    rows = [
        ("small", ProposalState.INVALID, [("applies", False)]),
        ("small", ProposalState.INVALID, [("applies", True), ("manifest", False)]),
        ("small", ProposalState.EVALUATED, [("applies", True), ("smoke", True)]),
        ("big", ProposalState.FAILED, [("applies", True), ("smoke", True)]),
        ("big", ProposalState.PROPOSED, []),  # not judged yet: not counted
    ]
    for sequence, (model, state, stages) in enumerate(rows, start=1):
        Proposal.objects.create(
            campaign=campaign,
            sequence=sequence,
            kind=ProposerKind.LLM_PATCH,
            state=state,
            stages=[{"stage": name, "ok": ok, "reason": ""} for name, ok in stages],
            params={"model": model},
            proposer_tokens=100,
            candidate=seed
            if state in (ProposalState.EVALUATED, ProposalState.EVALUATING)
            else None,
        )
    big, small = proposer_validity(campaigns=[campaign])
    assert (small.model, small.judged, small.valid, small.proposer_tokens) == ("small", 3, 1, 300)
    assert small.rejected_at == {"applies": 1, "manifest": 1}
    assert small.valid_share == pytest.approx(1 / 3)
    assert (big.model, big.judged, big.valid_share, big.rejected_at) == ("big", 1, 1.0, None)
