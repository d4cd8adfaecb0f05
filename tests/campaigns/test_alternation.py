"""The alternation switch rules (``phase_of``: fixed schedule, patience, the policy-step cap)
and the configuration's validation, including campaign_create's refusal of a policy that a
trained adapter cannot be loaded on."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from coevo.campaigns.alternation import (
    DEFAULTS,
    EXPORT_DEFAULTS,
    EndedProposal,
    Phase,
    alternation_read,
    alternation_validate,
    phase_of,
)
from coevo.campaigns.services import campaign_create
from coevo.errors import InvalidInput
from coevo.policies.models import EndpointKind
from coevo.training.models import Trainer
from coevo.training.trainers import trainer_register

H, HI = EndedProposal(policy=False, improved=False), EndedProposal(policy=False, improved=True)
P, PI = EndedProposal(policy=True, improved=False), EndedProposal(policy=True, improved=True)


def config(**overrides) -> dict:
    return {"trainer": "tiny-lora", **DEFAULTS, "export": dict(EXPORT_DEFAULTS), **overrides}


def fixed(harness_steps: int = 3, policy_steps: int = 1, max_policy_steps: int = 3) -> dict:
    return config(
        switch="fixed",
        harness_steps=harness_steps,
        policy_steps=policy_steps,
        max_policy_steps=max_policy_steps,
    )


def patience(patience: int = 2, max_policy_steps: int = 3) -> dict:
    return config(switch="patience", patience=patience, max_policy_steps=max_policy_steps)


def phase(alternation: dict, *steps: EndedProposal) -> Phase:
    return phase_of(alternation=alternation_read(stored=alternation), steps=steps)


# --- phase_of: no alternation ----------------------------------------------------------------


def test_without_alternation_every_step_is_a_harness_step():
    assert phase({}) == Phase("harness", 0, 0, 0, "harness steps only")
    assert phase({}, H, H, H, H, H).name == "harness"
    assert phase({}, P, P).name == "harness"


# --- phase_of: the fixed schedule ------------------------------------------------------------


def test_a_campaign_starts_with_harness_steps():
    assert phase(fixed()) == Phase("harness", 0, 0, 0, "a campaign starts with harness steps")


def test_the_fixed_schedule_switches_after_harness_steps():
    assert phase(fixed(harness_steps=3), H, H) == Phase(
        "harness", 2, 2, 0, "a campaign starts with harness steps"
    )
    assert phase(fixed(harness_steps=3), H, H, H) == Phase(
        "policy", 0, 0, 0, "3 harness step(s) taken (fixed schedule)"
    )


def test_the_fixed_schedule_switches_whether_or_not_steps_improved():
    assert phase(fixed(harness_steps=2), HI, HI).name == "policy"
    assert phase(fixed(harness_steps=2), HI).name == "harness"


def test_the_fixed_schedule_goes_back_to_harness_steps_after_policy_steps():
    alternation = fixed(harness_steps=2, policy_steps=2)
    assert phase(alternation, H, H, P) == Phase(
        "policy", 1, 1, 1, "2 harness step(s) taken (fixed schedule)"
    )
    assert phase(alternation, H, H, P, PI) == Phase(
        "harness", 0, 0, 2, "2 policy step(s) taken (fixed schedule)"
    )
    assert phase(alternation, H, H, P, P, H, H).name == "policy"


def test_the_fixed_schedule_alternates_one_to_one():
    alternation = fixed(harness_steps=1, policy_steps=1, max_policy_steps=10)
    history: list[EndedProposal] = []
    names = []
    for _ in range(6):
        current = phase(alternation, *history)
        names.append(current.name)
        history.append(P if current.name == "policy" else H)
    assert names == ["harness", "policy"] * 3


# --- phase_of: the patience rule ---------------------------------------------------------------


def test_the_patience_rule_switches_after_steps_without_improvement():
    assert phase(patience(2), H).name == "harness"
    assert phase(patience(2), H, H) == Phase(
        "policy", 0, 0, 0, "2 harness step(s) in a row without a validation improvement"
    )


def test_an_improvement_resets_the_patience_count():
    assert phase(patience(2), H, HI, H) == Phase(
        "harness", 3, 1, 0, "a campaign starts with harness steps"
    )
    assert phase(patience(2), H, HI, H, H).name == "policy"
    assert phase(patience(2), HI, HI, HI, HI).name == "harness"


def test_the_patience_rule_keeps_policy_steps_while_they_improve():
    alternation = patience(2, max_policy_steps=10)
    assert phase(alternation, H, H, PI, PI, PI) == Phase(
        "policy", 3, 0, 3, "2 harness step(s) in a row without a validation improvement"
    )
    assert phase(alternation, H, H, PI, P) == Phase(
        "policy", 2, 1, 2, "2 harness step(s) in a row without a validation improvement"
    )
    assert phase(alternation, H, H, PI, P, P) == Phase(
        "harness", 0, 0, 3, "2 policy step(s) in a row without a validation improvement"
    )


def test_patience_of_one_switches_at_every_stale_step():
    alternation = patience(1, max_policy_steps=10)
    assert phase(alternation, H).name == "policy"
    assert phase(alternation, H, P).name == "harness"
    assert phase(alternation, H, PI).name == "policy"


# --- phase_of: the cap ---------------------------------------------------------------------------


def test_max_policy_steps_ends_policy_steps_for_good():
    alternation = fixed(harness_steps=1, policy_steps=1, max_policy_steps=2)
    assert phase(alternation, H).name == "policy"
    assert phase(alternation, H, P, H).name == "policy"
    assert phase(alternation, H, P, H, P, H) == Phase(
        "harness", 0, 0, 2, "max policy steps reached (2)"
    )
    assert phase(alternation, H, P, H, P, H, H, H, H).name == "harness"


def test_max_policy_steps_caps_an_improving_policy_phase():
    alternation = patience(2, max_policy_steps=2)
    assert phase(alternation, H, H, PI).name == "policy"
    assert phase(alternation, H, H, PI, PI) == Phase(
        "harness", 2, 0, 2, "max policy steps reached (2)"
    )


def test_failed_policy_steps_count_toward_the_cap():
    # A failed step is recorded as not improved: it is a policy step all the same.
    alternation = fixed(harness_steps=1, policy_steps=1, max_policy_steps=1)
    assert phase(alternation, H, P, H).name == "harness"


def test_a_history_the_rules_did_not_write_starts_a_new_phase():
    # E.g. the configuration changed: a policy step where the schedule wanted a harness step.
    alternation = fixed(harness_steps=3, policy_steps=2, max_policy_steps=10)
    assert phase(alternation, H, P) == Phase(
        "policy", 1, 1, 1, "a campaign starts with harness steps"
    )
    assert phase(alternation, H, P, H) == Phase(
        "harness", 1, 1, 1, "a campaign starts with harness steps"
    )


# --- alternation_validate ----------------------------------------------------------------------


@pytest.fixture
def trainer(db) -> Trainer:
    return trainer_register(name="tiny-lora", command=["train", "{export}"], time_limit_s=600)


def validate(raw, campaign_patience=None):
    return alternation_validate(raw=raw, campaign_patience=campaign_patience)


@pytest.mark.parametrize("raw", [None, {}])
def test_empty_alternation_means_harness_steps_only(db, raw):
    assert validate(raw) == {}


def test_code_reads_what_validation_stored_as_the_typed_configuration_with_nothing_lost(trainer):
    stored = validate(
        {
            "trainer": "tiny-lora",
            "switch": "patience",
            "patience": 1,
            "time_limit_s": 60,
            "export": {"format": "prompt_completion", "min_score": 0.5},
        }
    )
    alternation = alternation_read(stored=stored)
    assert asdict(alternation) == stored
    assert alternation.export.format == "prompt_completion" and alternation.patience == 1
    assert alternation_read(stored=validate({})) is None


def test_it_fills_in_every_default(trainer):
    assert validate({"trainer": "tiny-lora"}) == {
        "trainer": "tiny-lora",
        "switch": "fixed",
        "harness_steps": 3,
        "policy_steps": 1,
        "patience": 2,
        "max_policy_steps": 3,
        "time_limit_s": None,
        "export": {
            "format": "chat",
            "successful_only": True,
            "min_score": None,
            "last_turns": None,
        },
    }


def test_it_keeps_the_values_given_and_treats_null_as_the_default(trainer):
    cleaned = validate(
        {
            "trainer": "tiny-lora",
            "switch": "patience",
            "patience": 3,
            "harness_steps": None,
            "max_policy_steps": 5,
            "time_limit_s": 600,
            "export": {
                "format": "prompt_completion",
                "successful_only": False,
                "min_score": 0.5,
                "last_turns": 2,
            },
        }
    )
    assert cleaned["switch"] == "patience" and cleaned["patience"] == 3
    assert cleaned["harness_steps"] == 3 and cleaned["max_policy_steps"] == 5
    assert cleaned["time_limit_s"] == 600
    assert cleaned["export"] == {
        "format": "prompt_completion",
        "successful_only": False,
        "min_score": 0.5,
        "last_turns": 2,
    }


@pytest.mark.parametrize("raw", [["tiny-lora"], "tiny-lora", 3])
def test_it_refuses_an_alternation_that_is_not_an_object(db, raw):
    with pytest.raises(InvalidInput, match="must be an object"):
        validate(raw)


def test_it_refuses_unknown_keys_and_lists_the_known_ones(trainer):
    with pytest.raises(InvalidInput, match=r"unknown keys \['every', 'split'\].*'harness_steps'"):
        validate({"trainer": "tiny-lora", "split": "validation", "every": 2})


@pytest.mark.parametrize("name", [None, "", 3])
def test_it_needs_a_trainer_name(trainer, name):
    raw = {"switch": "fixed"} if name is None else {"trainer": name}
    with pytest.raises(InvalidInput, match="name a registered trainer"):
        validate(raw)


def test_it_names_the_registered_trainers_for_an_unknown_one(trainer):
    trainer_register(name="big-lora", command=["train"])
    with pytest.raises(
        InvalidInput, match=r"No trainer named 'nope' \(registered: big-lora, tiny-lora\)"
    ):
        validate({"trainer": "nope"})


def test_it_refuses_a_disabled_trainer(trainer):
    Trainer.objects.filter(id=trainer.id).update(enabled=False)
    with pytest.raises(InvalidInput, match="disabled"):
        validate({"trainer": "tiny-lora"})


@pytest.mark.parametrize("switch", ["alternate", "", "FIXED", 1])
def test_it_refuses_an_unknown_switch_rule(trainer, switch):
    with pytest.raises(InvalidInput, match="is not a rule"):
        validate({"trainer": "tiny-lora", "switch": switch})


@pytest.mark.parametrize("key", ["harness_steps", "policy_steps", "patience", "max_policy_steps"])
@pytest.mark.parametrize("value", [0, -1, 1001, "3", 2.5, True])
def test_it_refuses_step_counts_that_are_not_small_positive_integers(trainer, key, value):
    with pytest.raises(
        InvalidInput, match=rf"alternation\.{key} must be an integer in \[1, 1000\]"
    ):
        validate({"trainer": "tiny-lora", key: value})


@pytest.mark.parametrize("key", ["harness_steps", "policy_steps", "patience", "max_policy_steps"])
def test_it_accepts_the_bounds_of_step_counts(trainer, key):
    assert validate({"trainer": "tiny-lora", key: 1})[key] == 1
    assert validate({"trainer": "tiny-lora", key: 1000})[key] == 1000


@pytest.mark.parametrize("limit", [0, -5, "60", 1.5, True])
def test_it_refuses_a_time_limit_that_is_not_positive_seconds(trainer, limit):
    with pytest.raises(InvalidInput, match="time_limit_s must be a positive integer"):
        validate({"trainer": "tiny-lora", "time_limit_s": limit})


def test_it_refuses_a_time_limit_above_the_trainers(trainer):
    assert validate({"trainer": "tiny-lora", "time_limit_s": 600})["time_limit_s"] == 600
    with pytest.raises(InvalidInput, match=r"above the trainer tiny-lora's own limit \(600 s\)"):
        validate({"trainer": "tiny-lora", "time_limit_s": 601})


@pytest.mark.parametrize("alternation_patience", [3, 4])
def test_it_refuses_a_switch_patience_the_campaign_would_not_wait_for(
    trainer, alternation_patience
):
    raw = {"trainer": "tiny-lora", "switch": "patience", "patience": alternation_patience}
    with pytest.raises(InvalidInput, match=r"must be below the campaign's patience \(3\)"):
        validate(raw, campaign_patience=3)


def test_a_switch_patience_below_the_campaigns_or_without_one_is_fine(trainer):
    raw = {"trainer": "tiny-lora", "switch": "patience", "patience": 2}
    assert validate(raw, campaign_patience=3)["patience"] == 2
    assert validate(raw, campaign_patience=None)["patience"] == 2
    # The fixed rule does not use it: no conflict with the campaign's patience.
    assert validate({**raw, "switch": "fixed"}, campaign_patience=2)["switch"] == "fixed"


def test_it_refuses_an_export_that_is_not_an_object(trainer):
    with pytest.raises(InvalidInput, match="alternation.export must be an object"):
        validate({"trainer": "tiny-lora", "export": ["chat"]})


@pytest.mark.parametrize("key", ["split", "candidate", "policy_version", "splits"])
def test_it_refuses_export_keys_the_step_decides_itself(trainer, key):
    with pytest.raises(InvalidInput, match=rf"unknown keys \['{key}'\].*the split is always"):
        validate({"trainer": "tiny-lora", "export": {key: "x"}})


@pytest.mark.parametrize("format", ["jsonl", "sharegpt", ""])
def test_it_refuses_an_unknown_export_format(trainer, format):
    with pytest.raises(InvalidInput, match="chat or prompt_completion"):
        validate({"trainer": "tiny-lora", "export": {"format": format}})


@pytest.mark.parametrize("value", ["yes", 1, 0])
def test_it_refuses_successful_only_that_is_not_a_boolean(trainer, value):
    with pytest.raises(InvalidInput, match="successful_only must be true or false"):
        validate({"trainer": "tiny-lora", "export": {"successful_only": value}})


@pytest.mark.parametrize("score", [-0.1, 1.5, "0.5", True])
def test_it_refuses_a_min_score_outside_zero_to_one(trainer, score):
    with pytest.raises(InvalidInput, match=r"min_score must lie in \[0, 1\]"):
        validate({"trainer": "tiny-lora", "export": {"min_score": score}})


@pytest.mark.parametrize("score", [0, 1, 0.25])
def test_it_accepts_a_min_score_in_range(trainer, score):
    assert (
        validate({"trainer": "tiny-lora", "export": {"min_score": score}})["export"]["min_score"]
        == score
    )


@pytest.mark.parametrize("turns", [0, -1, 1.5, "2", True])
def test_it_refuses_last_turns_that_are_not_positive(trainer, turns):
    with pytest.raises(InvalidInput, match="last_turns must be a positive integer"):
        validate({"trainer": "tiny-lora", "export": {"last_turns": turns}})


# --- campaign_create -----------------------------------------------------------------------------


def create(project, seed, suite, policy, **kwargs):
    return campaign_create(
        project=project,
        name="alternating",
        seed_candidate=seed,
        policy_version=policy,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        **kwargs,
    )


def test_campaign_create_stores_the_cleaned_alternation(project, seed, suite, base_policy, trainer):
    campaign = create(
        project, seed, suite, base_policy, alternation={"trainer": "tiny-lora", "harness_steps": 2}
    )
    campaign.refresh_from_db()
    assert campaign.alternates
    assert campaign.alternation == validate({"trainer": "tiny-lora", "harness_steps": 2})
    assert campaign.current_policy_version == base_policy
    assert campaign.active_policy_version == base_policy


def test_campaign_create_without_alternation_runs_harness_steps_only(
    project, seed, suite, policy_version
):
    campaign = create(project, seed, suite, policy_version)
    assert campaign.alternation == {} and not campaign.alternates


def test_campaign_create_refuses_alternation_on_an_endpoint_that_cannot_load_adapters(
    project, seed, suite, policy_version, trainer
):
    assert policy_version.endpoint.kind == EndpointKind.OPENAI_COMPATIBLE
    with pytest.raises(
        InvalidInput, match="only a vLLM endpoint or the coevo llama.cpp host loads at run time"
    ):
        create(project, seed, suite, policy_version, alternation={"trainer": "tiny-lora"})
    from coevo.campaigns.models import Campaign

    assert not Campaign.objects.exists()


def test_campaign_create_refuses_an_invalid_alternation(project, seed, suite, base_policy, trainer):
    with pytest.raises(InvalidInput, match="No trainer named 'other'"):
        create(project, seed, suite, base_policy, alternation={"trainer": "other"})
    with pytest.raises(InvalidInput, match="below the campaign's patience"):
        create(
            project,
            seed,
            suite,
            base_policy,
            patience=2,
            alternation={"trainer": "tiny-lora", "switch": "patience", "patience": 2},
        )
