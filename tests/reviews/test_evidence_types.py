"""Promotion evidence as a type (coevo.reviews.promotions.evidence_types): every stored version
reads through ``Evidence.from_payload`` (tests/reviews/data holds a stored payload of each), the
current one writes back unchanged, and ``sealed_evidence`` is the one rule for what a member who
is not reviewing may see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevo.projects.audience import Audience
from coevo.reviews.promotions.evidence_types import (
    EVIDENCE_VERSION,
    Evidence,
    evidence_read,
    sealed_evidence,
)
from tests.reviews.conftest import MARKER

DATA = Path(__file__).parent / "data"


def stored(version: int) -> dict:
    return json.loads((DATA / f"evidence_v{version}.json").read_text())


def test_it_writes_a_stored_current_payload_back_unchanged():
    payload = stored(2)
    assert payload["version"] == EVIDENCE_VERSION
    assert Evidence.from_payload(payload).to_payload() == payload


@pytest.mark.django_db
def test_it_writes_freshly_assembled_evidence_back_unchanged(marked_promotion):
    """What evidence_build stores today reads through the type and back to the same JSON (the
    API answers a reviewer with to_payload)."""
    payload = marked_promotion.evidence
    assert Evidence.from_payload(payload).to_payload() == payload


def test_it_reads_a_stored_version_1_payload_in_todays_terms():
    old = stored(1)
    evidence = Evidence.from_payload(old)

    # Version 1 had no reference summary, baseline or task list; its holder is the reference.
    assert evidence.reference is None and evidence.baseline is None
    assert evidence.heldout_tasks is None
    assert (
        evidence.reference_side is evidence.holder and evidence.holder.sha == old["holder"]["sha"]
    )
    # Its flipped tasks named the reference "holder".
    (flip,) = evidence.comparison.flipped_tasks
    (stored_flip,) = old["comparison"]["flipped_tasks"]
    assert flip.reference_rollout == stored_flip["holder_rollout"]
    assert flip.reference_score == stored_flip["holder_score"]
    assert flip.candidate_rollout == stored_flip["candidate_rollout"]
    # Unlabelled scores and no "missing" reasons; the figures as stored.
    search = evidence.candidate.scores["search"]
    assert search.mean == 1.0 and search.suite is None
    assert evidence.candidate.missing == {}
    assert evidence.generalization.search_gain == 1.0 and evidence.generalization.note is None
    assert evidence.comparison.statistics().verdict == old["comparison"]["verdict"]


def test_it_writes_a_stored_version_1_payload_back_unchanged():
    """The API answers an old request as it always did (docs/api.md: version 1 keeps its
    ``holder_*`` names); only readers in Python see today's terms."""
    old = stored(1)
    evidence = Evidence.from_payload(old)
    assert evidence.version == 1
    assert evidence.to_payload() == old
    sealed = sealed_evidence(evidence=evidence, audience=Audience.MEMBER).to_payload()
    assert "flipped_tasks" not in sealed["comparison"] and sealed["version"] == 1


def test_it_reads_a_stored_version_2_payload():
    evidence = Evidence.from_payload(stored(2))
    assert evidence.reference.kind == "holder"
    assert evidence.candidate.scores["search"].suite == "leaky-keys@v1"
    assert evidence.candidate.scores["heldout"].suite is None
    assert evidence.candidate.missing["validation"].startswith("No validation evaluation")
    assert [task.task for task in evidence.heldout_tasks.tasks] == ["h1-stored", "h2-stored"]
    assert evidence.comparison.flips["fixed"] == ("h1-stored",)
    assert evidence.diff.files and evidence.lineage.commits


def test_it_reads_no_evidence_before_it_is_assembled():
    assert evidence_read(payload={}) is None
    assert evidence_read(payload=None) is None
    assert sealed_evidence(evidence=None, audience=Audience.MEMBER) is None


def test_a_member_gets_the_aggregates_and_no_per_task_heldout_result():
    payload = stored(2)
    sealed = sealed_evidence(evidence=Evidence.from_payload(payload), audience=Audience.MEMBER)
    out = sealed.to_payload()

    # What the API stripped before the type: the task list, and the comparison's flips,
    # flipped tasks and dropped counts; everything else as stored.
    assert "heldout_tasks" not in out
    assert not {"flips", "flipped_tasks", "dropped"} & set(out["comparison"])
    expected = {key: value for key, value in payload.items() if key != "heldout_tasks"}
    expected["comparison"] = {
        key: value
        for key, value in payload["comparison"].items()
        if key not in ("flips", "flipped_tasks", "dropped")
    }
    assert out == expected
    assert "h1-stored" not in json.dumps(out)
    # The verdict line reads the same from the sealed comparison.
    full = Evidence.from_payload(payload).comparison.statistics()
    assert sealed.comparison.statistics().verdict == full.verdict
    assert sealed.comparison.statistics().p_value == full.p_value


def test_a_reviewer_gets_the_whole_evidence():
    evidence = Evidence.from_payload(stored(2))
    assert sealed_evidence(evidence=evidence, audience=Audience.REVIEWER) is evidence


@pytest.mark.django_db
def test_the_sealed_evidence_of_a_real_request_holds_no_heldout_key(marked_promotion):
    evidence = evidence_read(payload=marked_promotion.evidence)
    assert MARKER in json.dumps(evidence.to_payload())
    sealed = sealed_evidence(evidence=evidence, audience=Audience.MEMBER)
    assert MARKER not in json.dumps(sealed.to_payload())


@pytest.mark.django_db
def test_the_demos_summary_reads_the_evidence_through_its_type(marked_promotion):
    from coevo.demo.promotion import promotion_summary

    lines = promotion_summary(marked_promotion, "http://coevo.test/promotion")
    assert lines[0].startswith("Compared with production's holder")
    assert lines[1].startswith("Held-out: candidate 50.0% on 2 games vs reference 0.0%")
    assert "not significant (p = 1)" in lines[1]
    assert lines[-1] == "Promotion to production: ready · http://coevo.test/promotion"
