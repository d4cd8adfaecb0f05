"""What coevo sends to a ``vllm`` endpoint, against real vLLM (the CPU build, conftest.py), each
through coevo's own client, services and worker: health and the context window, token counts,
completions and chat with their sampling, logprobs and token ids, seeds, tools read by the
pythonic parser, llm-patch's JSON-schema answers, a LoRA the built-in trainer made loaded,
asked, re-loaded and unloaded at run time, a request the server cannot serve, and a program
harness's rollout through the boundary."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from coevo.campaigns.answers import answer_request_fields
from coevo.errors import PolicyRequestFailed, PolicyRequestRejected
from coevo.policies.client import PolicyClient, ServerFlavor, ServerInfo
from coevo.policies.models import EndpointKind, LoadedAdapter, PolicyEndpoint
from coevo.policies.services import (
    policy_adapter_ensure,
    policy_adapters_unload_idle,
    policy_client_for,
    policy_version_create,
)
from coevo.policies.vllm_local import MAX_LORA_RANK
from tests.vllm.conftest import SERVED
from tests.workers.test_program_harness import program, steps
from workers.environments.base import Verdict
from workers.outcomes import RolloutOutcome
from workers.policy import Sampling
from workers.rollout import RolloutInputs, execute_rollout

PROMPT = "The capital of France is"
# A program harness with one chat call through the boundary, its reply the answer. It names
# max_tokens: without it the boundary grants what the context leaves, minutes of decoding here.
ASK = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = json.dumps({"model": "gpt-4o", "max_tokens": 12,
                   "messages": [{"role": "user", "content": task["question"]}]}).encode()
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request))
json.dump(reply["choices"][0]["message"]["content"], open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def client(vllm):
    with PolicyClient(vllm.server.url, model=SERVED, kind="vllm", retries=1) as client:
        yield client


@pytest.fixture
def endpoint(db, vllm, settings):
    settings.COEVO_POLICY_RETRIES = 1
    return PolicyEndpoint.objects.create(
        name="vllm-cpu", base_url=vllm.server.url, kind=EndpointKind.VLLM
    )


@pytest.fixture
def base_version(endpoint):
    return policy_version_create(name="gemma", endpoint=endpoint, base_model=SERVED)


def test_health_the_context_window_and_token_counts_are_read_from_vllm(client):
    assert client.health().up
    assert SERVED in client.models()  # with any adapter another test left loaded
    # /v1/models' max_model_len: the flag the local vLLM was started with.
    assert client.server_info() == ServerInfo(ServerFlavor.VLLM, 4096)
    # "<bos>The capital of France is": the converted tokenizer adds Gemma's BOS, as llama.cpp
    # does from the GGUF file.
    assert client.token_count(PROMPT, flavor=ServerFlavor.VLLM) == 6


def test_a_greedy_completion_repeats_with_its_logprobs_token_ids_and_explicit_sampling(client):
    body = {"prompt": PROMPT, **Sampling(max_tokens=8).as_params()}
    body |= {"logprobs": 2, "return_token_ids": True}

    first = client.forward("completions", body)
    again = client.forward("completions", body)

    assert first.text.strip() and first.text == again.text
    assert (first.prompt_tokens, first.completion_tokens) == (6, 8)
    assert first.finish_reason == "length"
    choice = first.raw["choices"][0]
    assert choice["prompt_token_ids"][0] == 2  # <bos>
    assert len(choice["token_ids"]) == 8
    assert len(choice["logprobs"]["top_logprobs"]) == 8
    assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])
    # Every sampling parameter went explicitly, vLLM's own with their neutral values (the
    # server runs with --generation-config vllm besides): what the trace records applied.
    assert (first.sampling["top_k"], first.sampling["min_p"]) == (0, 0.0)
    assert first.sampling["repetition_penalty"] == 1.0
    assert "repeat_penalty" not in first.sampling and first.dropped == ()


def test_a_completion_with_the_shipped_harness_stop_strings_is_served(client):
    """The HumanEval example harness stops on 7 strings; vLLM takes 4 unless the server says
    otherwise (VLLM_MAX_STOP_STRINGS), and refuses the request with 400."""
    stops = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert ")
    prompt = 'def add(a, b):\n    """Return a + b."""\n'

    reply = client.complete(prompt, Sampling(max_tokens=24, stop=stops))

    assert reply.finish_reason in ("stop", "length")
    assert not any(stop in reply.text for stop in stops)


def test_seeded_sampling_is_reproducible_and_n_gives_several_choices(client):
    def sample(seed: int, **extra) -> list[str]:
        body = {"prompt": PROMPT, **Sampling(max_tokens=12, temperature=1.0, seed=seed).as_params()}
        reply = client.forward("completions", body | extra)
        return [choice["text"] for choice in reply.raw["choices"]]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    assert len(sample(7, n=2)) == 2


def test_a_chat_request_is_rendered_with_the_chat_template(client):
    reply = client.chat([{"role": "user", "content": "Say hello."}], Sampling(max_tokens=8))

    assert reply.text and reply.completion_tokens <= 8
    # The template's Gemma turns, after the BOS: 12 tokens for this one message.
    assert reply.prompt_tokens == 12


def test_a_pythonic_tool_call_comes_back_as_openais_tool_calls(client):
    """Gemma 3 270M is a base model: shown two calls, greedy decoding writes the third as a
    Python list and runs on; max_tokens stops it right after the list, which vLLM's pythonic
    parser reads into tool_calls."""
    shown = [
        {"role": "user", "content": "What is the weather in London?"},
        {"role": "assistant", "content": '[weather(city="London")]'},
        {"role": "user", "content": "What is the weather in Berlin?"},
        {"role": "assistant", "content": '[weather(city="Berlin")]'},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    # The call's tokens, less the BOS that token_count counts.
    length = client.token_count('[weather(city="Paris")]', flavor=ServerFlavor.VLLM) - 1

    reply = client.forward(
        "chat",
        {"messages": shown, "tools": [WEATHER], **Sampling(max_tokens=length).as_params()},
    )

    message = reply.raw["choices"][0]["message"]
    assert reply.finish_reason == "tool_calls", message
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_llm_patchs_json_schema_answer_is_enforced_on_completions(client):
    """What llm-patch sends a vLLM endpoint (its default api, completions): the answer's JSON
    schema as response_format, which vLLM enforces while decoding."""
    fields, enforced = answer_request_fields(
        flavor=ServerFlavor.VLLM, paths=["agent.py"], directories=[]
    )
    assert enforced == "response_format"
    prompt = 'Answer in JSON with a hypothesis and edits to agent.py.\n{"hypothesis": "'

    reply = client.forward(
        "completions", {"prompt": prompt, **Sampling(max_tokens=160).as_params(), **fields}
    )

    assert "response_format" not in reply.dropped
    answer = json.loads(reply.text)
    assert set(answer) == {"hypothesis", "edits"}
    assert all(edit["path"] == "agent.py" for edit in answer["edits"])


def test_a_json_schema_answer_is_enforced_on_chat(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = client.forward(
        "chat",
        {
            "messages": [{"role": "user", "content": "Name a city in France, in JSON."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": schema, "strict": True},
            },
            **Sampling(max_tokens=40).as_params(),
        },
    )

    assert isinstance(json.loads(reply.text)["city"], str)


def test_the_servers_lora_rank_admits_the_built_in_trainers_adapters(trained_adapter):
    config = json.loads((trained_adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] <= MAX_LORA_RANK


def test_a_trained_adapter_is_loaded_asked_reloaded_and_unloaded_at_run_time(
    base_version, endpoint, trained_adapter, adapter_copy, settings, vllm
):
    version = policy_version_create(
        name="gemma-ft1",
        endpoint=endpoint,
        parent=base_version,
        adapter_name="ft1",
        adapter_path=str(trained_adapter),
    )
    base = Sampling(max_tokens=6)

    with policy_client_for(version=base_version) as client:
        base_text = client.complete(PROMPT, base).text
    # The first request loads the adapter (vLLM's /v1/load_lora_adapter) and asks it by name.
    with policy_client_for(version=version) as client:
        tuned = client.complete(PROMPT, base)
    assert tuned.model == "ft1"
    assert tuned.text != base_text  # one step of training changed the greedy answer
    with PolicyClient(vllm.server.url, model="ft1", kind="vllm", retries=0) as direct:
        assert direct.lora_paths() == {"ft1": str(trained_adapter)}

        # Listed from its path: no second load (vLLM would refuse it with 400).
        assert not policy_adapter_ensure(endpoint=endpoint, version=version)
        with pytest.raises(PolicyRequestRejected) as refused:
            direct.lora_load(name="ft1", path=str(trained_adapter))
        assert refused.value.status == 400 and "load_inplace" in refused.value.reply

        # Installed again elsewhere: loaded in place under the same name.
        version.adapter_path = str(adapter_copy)
        version.save(update_fields=["adapter_path"])
        assert policy_adapter_ensure(endpoint=endpoint, version=version)
        assert direct.lora_paths() == {"ft1": str(adapter_copy)}
        assert direct.complete(PROMPT, base).text == tuned.text

        # Idle past COEVO_ADAPTER_IDLE_S: unloaded; asking it by name is then vLLM's 404.
        settings.COEVO_ADAPTER_IDLE_S = 60
        LoadedAdapter.objects.update(last_used_at=timezone.now() - timedelta(hours=1))
        assert policy_adapters_unload_idle() == ["ft1@vllm-cpu"]
        assert direct.lora_paths() == {}
        with pytest.raises(PolicyRequestRejected) as gone:
            direct.complete(PROMPT, base)
        assert gone.value.status == 404

    # The next rollout of the version loads it again.
    with policy_client_for(version=version) as client:
        assert client.complete(PROMPT, base).text == tuned.text
    with PolicyClient(vllm.server.url, model="", kind="vllm", retries=0) as direct:
        direct.lora_unload(name="ft1")


def test_a_request_vllm_cannot_serve_never_marks_the_endpoint_unhealthy(base_version, endpoint):
    """tool_choice "required" on a model that writes no call: vLLM answers it (vllm-cpu 0.32:
    200 with no call; vLLM 0.25 on a GPU: 500). Either way the endpoint stays healthy and the
    next plain request goes through."""
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    with policy_client_for(version=base_version) as client:
        try:
            reply = client.forward(
                "chat",
                {"messages": asked, "tools": [WEATHER], "tool_choice": "required",
                 **Sampling(max_tokens=24).as_params()},
            )  # fmt: skip
            answered = f"200, finish_reason {reply.finish_reason}"
        # The request's own failure: a 500 this request alone gets, or a 4xx.
        except (PolicyRequestFailed, PolicyRequestRejected) as exc:
            answered = f"{exc.status}: {exc.reply[:200]}"

    endpoint.refresh_from_db()
    assert endpoint.healthy and endpoint.consecutive_failures == 0, answered
    with policy_client_for(version=base_version) as client:
        assert client.complete(PROMPT, Sampling(max_tokens=4)).text


def test_a_program_harness_rollout_reaches_vllm_through_the_boundary(tmp_path, vllm):
    harness = program(tmp_path, {"main.py": ASK}, command='["python3", "main.py"]')
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="q1",
        task_view={"question": "is the sky blue?"},
        knob_overrides={},
        seed=11,
        wall_time_s=120,
        policy_version="gemma",
    )

    def verify(answer):
        passed = isinstance(answer, str) and bool(answer.strip())
        return Verdict(passed=passed, score=float(passed), detail=f"answer {answer!r}")

    with PolicyClient(vllm.server.url, model=SERVED, kind="vllm", retries=1) as client:
        result = execute_rollout(inputs, policy=client, verify=verify)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = steps(result, "model_call")
    assert call["via"] == "boundary" and call["api"] == "chat"
    assert call["completion"] == result.answer
    # The rollout's seed, and vLLM's sampling parameters sent explicitly.
    assert (call["sampling"]["seed"], call["sampling"]["max_tokens"]) == (11, 12)
    assert (call["sampling"]["top_k"], call["sampling"]["repetition_penalty"]) == (0, 1.0)
    assert result.prompt_tokens > 0 and result.model_calls == 1
