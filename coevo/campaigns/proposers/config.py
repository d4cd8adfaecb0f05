"""The ``config`` proposer: Optuna TPE over the manifest's typed knobs (HARBOR: a harness that
is a set of flags is searched as noisy black-box optimization).

Each trial becomes a candidate whose only change is the ``default = …`` lines of its knobs in
``harness.toml`` (the rest of the file stays byte-identical, comments included). The study
lives in the project's database (Optuna's RDBStorage on Django's own database), named after
the campaign, so a resumed campaign, or another worker, continues the same study.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
import threading
import tomllib
from typing import Any

import optuna
from django.db import connections
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.base import Draft, ProposalOutcome, stage
from coevo.errors import InvalidInput, InvalidManifest
from harness_store.manifest import MANIFEST_NAME, Manifest, parse_manifest
from harness_store.selectors import candidate_read_file

logger = logging.getLogger(__name__)

# Optuna logs every trial at INFO; the campaign's records say the same thing.
optuna.logging.set_verbosity(optuna.logging.WARNING)
optuna.logging.disable_default_handler()

_STORAGES: dict[str, RDBStorage] = {}
_STORAGES_LOCK = threading.Lock()


def optuna_storage_url(database: dict[str, Any] | None = None) -> str:
    """The SQLAlchemy URL of Django's default database (the test database under tests)."""
    db = database or connections["default"].settings_dict
    engine = db["ENGINE"]
    if "postgresql" in engine:
        return URL.create(
            "postgresql+psycopg",
            username=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=int(db["PORT"]) if db.get("PORT") else None,
            database=db["NAME"],
        ).render_as_string(hide_password=False)
    if "sqlite" in engine:
        name = str(db["NAME"])
        if name == ":memory:" or name.startswith("file:memorydb"):
            raise InvalidInput("The config proposer needs a database file, not in-memory SQLite.")
        # A file of its own beside Django's: the runner holds SQLite's one write lock (IMMEDIATE
        # transactions) while it asks the proposer, so a study in the same file would wait on it.
        return f"sqlite:///{name}-optuna"
    raise InvalidInput(f"The config proposer cannot store its study in a {engine} database.")


def optuna_storage() -> RDBStorage:
    url = optuna_storage_url()
    with _STORAGES_LOCK:
        storage = _STORAGES.get(url)
        if storage is None:
            # NullPool: no connection outlives a call, so nothing holds the database open
            # between campaign steps (or keeps a test database from being dropped).
            storage = RDBStorage(url, engine_kwargs={"poolclass": NullPool})
            _STORAGES[url] = storage
        return storage


def optuna_storages_close() -> None:
    with _STORAGES_LOCK:
        for storage in _STORAGES.values():
            storage.engine.dispose()
        _STORAGES.clear()


def study_name(campaign: Campaign) -> str:
    return f"coevo-campaign-{campaign.id}"


# --- the search space ----------------------------------------------------------------------


def search_space(manifest: Manifest, names: list[str] | None = None) -> dict[str, BaseDistribution]:
    """Optuna distributions for the knobs to search: every knob with a range (numbers need
    both min and max), or only ``names``."""
    space: dict[str, BaseDistribution] = {}
    for name, knob in manifest.knobs.items():
        if names is not None and name not in names:
            continue
        if knob.type == "bool":
            space[name] = CategoricalDistribution([False, True])
        elif knob.type == "choice":
            space[name] = CategoricalDistribution(list(knob.choices))
        elif knob.min is not None and knob.max is not None and knob.min < knob.max:
            if knob.type == "int":
                space[name] = IntDistribution(int(knob.min), int(knob.max))
            else:
                space[name] = FloatDistribution(float(knob.min), float(knob.max))
    return space


def config_options_validate(*, manifest: Manifest, options: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` strategy entry's options: ``{"knobs": [names]}`` (default: all with a range)."""
    unknown = sorted(set(options) - {"knobs"})
    if unknown:
        raise InvalidInput(f"config proposer: unknown options {unknown} (known: knobs).")
    names = options.get("knobs")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
            raise InvalidInput("config proposer: knobs must be a non-empty list of knob names.")
        undeclared = sorted(set(names) - set(manifest.knobs))
        if undeclared:
            raise InvalidInput(
                f"config proposer: knobs {undeclared} are not declared in the seed's "
                f"{MANIFEST_NAME} (declared: {', '.join(sorted(manifest.knobs)) or 'none'})."
            )
    space = search_space(manifest, names)
    if not space:
        raise InvalidInput(
            f"config proposer: the seed's {MANIFEST_NAME} has no knob to search (a knob needs "
            "type bool or choice, or a number type with both min and max)."
        )
    return {"knobs": names} if names is not None else {}


# --- editing harness.toml as text ----------------------------------------------------------

_DEFAULT_LINE = re.compile(r"^(?P<lead>\s*default\s*=\s*)(?P<value>.*?)(?P<tail>\s*(#.*)?)$")


def knob_defaults_set(text: str, values: dict[str, Any]) -> str:
    """``text`` with the ``default = …`` line of each ``[knobs.NAME]`` table set to the value.

    Only those lines change, so comments and layout survive. Raises InvalidManifest when a knob
    has no such table or line (e.g. an inline table), or the result does not parse back to the
    same manifest with only these defaults changed.
    """
    lines = text.splitlines(keepends=True)
    for name, value in values.items():
        header = re.compile(
            r"^\s*\[\s*knobs\s*\.\s*(?:" + re.escape(name) + r'|"' + re.escape(name) + r'")\s*\]'
            r"\s*(#.*)?$"
        )
        start = next((i for i, line in enumerate(lines) if header.match(line.rstrip("\r\n"))), None)
        if start is None:
            raise InvalidManifest(
                f"{MANIFEST_NAME}: no [knobs.{name}] table to edit (inline knob tables are not "
                "supported by the config proposer)."
            )
        for i in range(start + 1, len(lines)):
            body = lines[i].rstrip("\r\n")
            if body.lstrip().startswith("["):
                break
            match = _DEFAULT_LINE.match(body)
            if match:
                ending = lines[i][len(body) :]
                lines[i] = f"{match['lead']}{toml_literal(value)}{match['tail']}{ending}"
                break
        else:
            raise InvalidManifest(f"{MANIFEST_NAME}: [knobs.{name}] has no default line to edit.")
    edited = "".join(lines)
    _check_only_defaults_changed(text, edited, values)
    return edited


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # Six significant digits: a knob default a person can read, and Optuna's exact float
        # is kept in the proposal's params.
        rounded = float(f"{value:.6g}")
        text = repr(rounded)
        return (
            text if any(c in text for c in ".eE") or "inf" in text or "nan" in text else text + ".0"
        )
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    raise InvalidManifest(f"cannot write {value!r} as a knob default")


def _check_only_defaults_changed(before: str, after: str, values: dict[str, Any]) -> None:
    try:
        old, new = tomllib.loads(before), tomllib.loads(after)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidManifest(f"{MANIFEST_NAME} does not parse after the edit: {exc}") from None
    for name in values:
        old["knobs"][name]["default"] = new["knobs"][name]["default"]
    if old != new:
        raise InvalidManifest(f"{MANIFEST_NAME}: the edit changed more than the knob defaults.")


def written_value(value: Any) -> Any:
    """The value as it reads back from the file (floats rounded as toml_literal writes them)."""
    return tomllib.loads(f"v = {toml_literal(value)}")["v"]


# Random draws before TPE models the space (Optuna's default is 10).
STARTUP_TRIALS = 3

# --- the proposer --------------------------------------------------------------------------


class ConfigProposer:
    drafts_slowly = False

    def __init__(self, campaign: Campaign, options: dict[str, Any]) -> None:
        self.campaign = campaign
        self.knob_names: list[str] | None = options.get("knobs")
        self._study: optuna.Study | None = None

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            study = optuna.create_study(
                study_name=study_name(self.campaign),
                storage=optuna_storage(),
                direction="maximize",
                load_if_exists=True,
            )
            # Seeded, and offset by the trials so far: a resumed campaign must not draw the same
            # random start-up points again.
            study.sampler = optuna.samplers.TPESampler(
                seed=_sampler_seed(self.campaign.seed, len(study.trials)),
                # Campaign budgets are a handful of trials, and the seed's own point is told
                # (below): model the space after a few random draws instead of Optuna's ten.
                n_startup_trials=STARTUP_TRIALS,
            )
            self._study = study
        return self._study

    def propose(self, *, history: list[dict[str, Any]]) -> Draft:
        parent = self.campaign.seed_candidate
        text = candidate_read_file(candidate=parent, path=MANIFEST_NAME).decode()
        manifest = parse_manifest(tomllib.loads(text))
        space = search_space(manifest, self.knob_names)
        study = self.study
        self._fail_orphans(study)
        self._tell_seed(study, manifest, space)
        trial = study.ask(space)
        params = dict(trial.params)
        shown = {
            "proposer": "config",
            "search_space": {name: _describe(dist) for name, dist in space.items()},
            # What TPE conditions on: the trials told so far (validation scores only, never
            # validation tasks or traces).
            "trials": [
                {"number": t.number, "params": t.params, "state": t.state.name, "value": t.value}
                for t in study.get_trials(deepcopy=False)
                if t.state != TrialState.RUNNING
            ],
            "candidates": history,
            "task_keys": [],
            "trace_ids": [],
        }
        return knob_defaults_draft(
            kind=ProposerKind.CONFIG,
            label=f"config trial {trial.number}",
            parent=parent,
            manifest_text=text,
            params=params,
            shown=shown,
            trial_number=trial.number,
        )

    def _tell_seed(
        self, study: optuna.Study, manifest: Any, space: dict[str, BaseDistribution]
    ) -> None:
        """The seed harness is a known point (its knob defaults, its validation score): tell it
        once, so the search starts from what the seed already achieves."""
        if any(t.user_attrs.get("coevo") == "seed" for t in study.get_trials(deepcopy=False)):
            return
        seed = self.campaign.proposals.filter(sequence=0, validation_score__isnull=False).first()
        if seed is None:
            return
        params = {name: manifest.knobs[name].default for name in space}
        try:
            known = optuna.trial.create_trial(
                params=params,
                distributions=space,
                value=float(seed.validation_score),
                user_attrs={"coevo": "seed"},
            )
        except ValueError:
            return  # a default outside its own range: nothing sound to tell
        study.add_trial(known)

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        if trial_number is None:
            return
        study = self.study
        try:
            if outcome == ProposalOutcome.COMPLETE and value is not None:
                study.tell(trial_number, value)
            elif outcome == ProposalOutcome.PRUNED:
                study.tell(trial_number, state=TrialState.PRUNED)
            else:
                study.tell(trial_number, state=TrialState.FAIL)
        except ValueError as exc:
            # Told already (a redelivered advance that lost its transaction after telling).
            logger.info("campaign %s: trial %s: %s", self.campaign.id, trial_number, exc)

    def _fail_orphans(self, study: optuna.Study) -> None:
        # The runner has at most one open proposal and tells it before asking again, so a trial
        # still RUNNING here was asked by an advance whose transaction rolled back.
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(trial.number, state=TrialState.FAIL)


def _describe(dist: BaseDistribution) -> dict[str, Any]:
    if isinstance(dist, CategoricalDistribution):
        return {"choices": list(dist.choices)}
    if isinstance(dist, IntDistribution):
        return {"type": "int", "low": dist.low, "high": dist.high}
    if isinstance(dist, FloatDistribution):
        return {"type": "float", "low": dist.low, "high": dist.high}
    return {"type": type(dist).__name__}


def _sampler_seed(campaign_seed: int, trials: int) -> int:
    """A seed per (campaign seed, trials so far), hashed: with ``seed + trials`` campaign seed s
    at trial k would draw what seed s+1 draws at trial k-1."""
    digest = hashlib.sha256(f"{campaign_seed}:{trials}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def knob_defaults_draft(
    *,
    kind: str,
    label: str,
    parent: Any,
    manifest_text: str,
    params: dict[str, Any],
    shown: dict[str, Any],
    trial_number: int | None = None,
) -> Draft:
    """A draft that sets the defaults of ``params``'s knobs in the parent's harness.toml (the
    config and random proposers' one kind of change), with its patch and "applies" stage."""
    draft = Draft(
        kind=kind,
        parents=[parent],
        changes={},
        message=(
            f"{label}: " + ", ".join(f"{k}={toml_literal(v)}" for k, v in sorted(params.items()))
        ),
        params=params,
        trial_number=trial_number,
        shown=shown,
    )
    try:
        edited = knob_defaults_set(manifest_text, params)
    except InvalidManifest as exc:
        draft.stages.append(stage("applies", False, str(exc)))
        return draft
    draft.changes = {MANIFEST_NAME: edited.encode()}
    draft.patch = "".join(
        difflib.unified_diff(
            manifest_text.splitlines(keepends=True),
            edited.splitlines(keepends=True),
            fromfile=f"a/{MANIFEST_NAME}",
            tofile=f"b/{MANIFEST_NAME}",
        )
    )
    draft.stages.append(
        stage("applies", True, f"set the defaults of {len(params)} knob(s) in {MANIFEST_NAME}")
    )
    return draft
