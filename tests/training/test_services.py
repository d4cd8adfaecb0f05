"""Trainers and training runs through the services: registering a trainer (and the management
command), refusing runs that cannot work, and executing runs in this process with the test
trainer (tests/support/tiny_trainer.py) as a real subprocess: adapter → PolicyVersion, and
every way a run ends otherwise."""

from __future__ import annotations

import hashlib
import stat
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from coevo.audit.models import AuditEvent
from coevo.errors import InvalidInput, InvalidState
from coevo.exports.services import export_path, trajectory_export_create
from coevo.policies.models import EndpointKind, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.training.models import Trainer, TrainingRun, TrainingState
from coevo.training.services import (
    training_run_cancel,
    training_run_create,
    training_run_execute,
    training_runs_watchdog,
)
from coevo.training.signals import training_finished
from coevo.training.trainers import MAX_TIME_LIMIT_S, trainer_get, trainer_register
from tests.exports.conftest import build, run_evaluation
from tests.training.conftest import ATTENTION
from tests.training.support import (
    TRAINER,
    execute_in_thread,
    make_run,
    make_trainer,
    tiny_command,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

PASS, FAIL = ("passed", 1.0), ("task_failure", 0.0)


@pytest.fixture
def finished_signals():
    sent: list[tuple] = []

    def receiver(sender, run_id, state, **kwargs):
        sent.append((run_id, state))

    training_finished.connect(receiver, weak=False, dispatch_uid="test-training-finished")
    yield sent
    training_finished.disconnect(dispatch_uid="test-training-finished")


# --- trainer_register ------------------------------------------------------------------------


def test_it_registers_a_trainer_and_audits_it_without_env_values(db):
    trainer = trainer_register(
        name="tiny-lora",
        command=tiny_command(),
        time_limit_s=600,
        env={"WANDB_API_KEY": "secret-value"},
        description="a test trainer",
    )
    trainer.refresh_from_db()
    assert trainer.command == tiny_command()
    assert (trainer.time_limit_s, trainer.enabled) == (600, True)
    assert trainer.env == {"WANDB_API_KEY": "secret-value"}
    assert trainer.description == "a test trainer"
    assert trainer_get(name="tiny-lora") == trainer

    event = AuditEvent.objects.get(action="trainer.registered")
    assert event.target_id == "tiny-lora"
    assert event.actor_id is None and event.project_id is None
    assert event.after == {
        "command": tiny_command(),
        "time_limit_s": 600,
        "env": ["WANDB_API_KEY"],  # names only: values may be credentials
        "enabled": True,
    }
    assert "secret-value" not in str(event.after)


@pytest.mark.parametrize(
    "command", [[], "python train.py {export}", [sys.executable, 3], None, [None]]
)
def test_it_refuses_a_command_that_is_not_an_argv(db, command):
    with pytest.raises(InvalidInput, match="non-empty list of strings"):
        trainer_register(name="t", command=command)
    assert not Trainer.objects.exists()


@pytest.mark.parametrize("arg", ["{data}", "--out={output}", "{export.name}", "{}", "{0}"])
def test_it_refuses_an_unknown_placeholder_and_lists_the_known_ones(db, arg):
    with pytest.raises(InvalidInput, match=r"unknown placeholder.*known: \{export\}"):
        trainer_register(name="t", command=["train", arg])


@pytest.mark.parametrize("arg", ["{export", "export}", "x}{export}"])
def test_it_refuses_a_stray_brace(db, arg):
    with pytest.raises(InvalidInput, match=r"write \{\{ for a brace"):
        trainer_register(name="t", command=["train", arg])


def test_it_accepts_escaped_braces_and_every_known_placeholder(db):
    command = ["train", "--json={{\"lr\": 1}}", "{export}", "{format}", "{base_model}",
               "{parent_adapter}", "{output_dir}", "{run_dir}"]  # fmt: skip
    assert trainer_register(name="t", command=command).command == command


@pytest.mark.parametrize("name", ["bad name", "tiny/lora", "", "x" * 65])
def test_it_refuses_a_name_that_is_not_a_short_slug(db, name):
    with pytest.raises(InvalidInput, match="name"):
        trainer_register(name=name, command=["train"])
    assert not Trainer.objects.exists()


@pytest.mark.parametrize("limit", [0, -1, MAX_TIME_LIMIT_S + 1, "60", 1.5])
def test_it_refuses_a_time_limit_out_of_bounds(db, limit):
    with pytest.raises(InvalidInput, match=rf"time_limit_s must lie in \[1, {MAX_TIME_LIMIT_S}\]"):
        trainer_register(name="t", command=["train"], time_limit_s=limit)


def test_it_accepts_the_bounds_of_the_time_limit(db):
    assert trainer_register(name="a", command=["train"], time_limit_s=1).time_limit_s == 1
    longest = trainer_register(name="b", command=["train"], time_limit_s=MAX_TIME_LIMIT_S)
    assert longest.time_limit_s == MAX_TIME_LIMIT_S


def test_it_refuses_an_env_that_sets_the_runs_own_variables(db):
    with pytest.raises(InvalidInput, match="may not set COEVO_EXPORT_PATH, COEVO_OUTPUT_DIR"):
        trainer_register(
            name="t",
            command=["train"],
            env={"COEVO_OUTPUT_DIR": "/tmp/x", "COEVO_EXPORT_PATH": "/tmp/y", "OK": "1"},
        )


def test_it_refuses_an_env_with_values_that_are_not_strings(db):
    with pytest.raises(InvalidInput, match="maps names to strings"):
        trainer_register(name="t", command=["train"], env={"EPOCHS": 3})


def test_it_refuses_a_second_trainer_of_the_same_name(db):
    first = make_trainer()
    with pytest.raises(InvalidInput, match="exists; pass replace"):
        trainer_register(name="tiny-lora", command=["other"])
    first.refresh_from_db()
    assert first.command == tiny_command()


def test_replace_updates_the_trainer_in_place_and_enables_it(db):
    first = make_trainer(env={"A": "1"})
    Trainer.objects.filter(id=first.id).update(enabled=False)
    second = trainer_register(
        name="tiny-lora", command=["other", "{export}"], time_limit_s=60, replace=True
    )
    assert second.id == first.id
    second.refresh_from_db()
    assert second.command == ["other", "{export}"]
    assert (second.time_limit_s, second.env, second.enabled) == (60, {}, True)
    assert Trainer.objects.count() == 1
    assert AuditEvent.objects.filter(action="trainer.registered").count() == 2


def test_trainer_get_names_the_registered_trainers_when_one_is_missing(db):
    make_trainer(name="alpha")
    make_trainer(name="beta")
    with pytest.raises(InvalidInput, match=r"No trainer named 'gamma' \(registered: alpha, beta\)"):
        trainer_get(name="gamma")


def test_trainer_get_refuses_a_disabled_trainer(db):
    trainer = make_trainer()
    Trainer.objects.filter(id=trainer.id).update(enabled=False)
    with pytest.raises(InvalidInput, match="disabled"):
        trainer_get(name="tiny-lora")


# --- the management command ------------------------------------------------------------------


def test_the_command_registers_a_trainer(db, capsys):
    call_command(
        "trainer_register", "tiny-lora", "--time-limit", "900", "--env", "WANDB_MODE=offline",
        "--env", "EMPTY=", "--description", "from the CLI", "--", *tiny_command(),
    )  # fmt: skip
    trainer = Trainer.objects.get(name="tiny-lora")
    assert trainer.command == tiny_command()
    assert trainer.time_limit_s == 900
    assert trainer.env == {"WANDB_MODE": "offline", "EMPTY": ""}
    assert trainer.description == "from the CLI"
    assert f"trainer tiny-lora: {' '.join(tiny_command())}" in capsys.readouterr().out


def test_the_command_replaces_only_when_asked(db):
    call_command("trainer_register", "t", "--", "train", "{export}")
    with pytest.raises(CommandError, match="pass replace"):
        call_command("trainer_register", "t", "--", "other")
    call_command("trainer_register", "t", "--replace", "--time-limit", "5", "--", "other")
    trainer = Trainer.objects.get(name="t")
    assert (trainer.command, trainer.time_limit_s) == (["other"], 5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "NOVALUE", "--", "train"], "expected NAME=VALUE"),
        (["--env", "=x", "--", "train"], "expected NAME=VALUE"),
        (["--", "train", "{data}"], "unknown placeholder"),
        (["--time-limit", "0", "--", "train"], "time_limit_s must lie"),
        (["--env", "COEVO_RUN_DIR=/x", "--", "train"], "may not set COEVO_RUN_DIR"),
    ],
)
def test_the_command_reports_bad_input_as_a_command_error(db, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("trainer_register", "t", *args)
    assert not Trainer.objects.exists()


def test_the_command_reports_a_bad_name_as_a_command_error(db):
    with pytest.raises(CommandError, match="name"):
        call_command("trainer_register", "bad name!", "--", "train")
    assert not Trainer.objects.exists()


# --- training_run_create ---------------------------------------------------------------------


def test_it_creates_a_pending_run_and_enqueues_it(project, owner, export, base_policy):
    run = make_run(project, owner, export, base_policy)
    run.refresh_from_db()
    assert run.state == TrainingState.PENDING
    assert run.time_limit_s == 120  # the trainer's own limit by default
    assert run.celery_task_id  # enqueued on commit, on the real broker
    assert run.parent_policy == base_policy and run.export == export
    event = AuditEvent.objects.get(action="training.created")
    assert event.target_id == str(run.id) and event.actor_id == owner.id
    assert event.after["trainer"] == "tiny-lora" and event.after["export"] == str(export.id)


def test_it_accepts_a_lower_time_limit(project, owner, export, base_policy):
    assert make_run(project, owner, export, base_policy, time_limit_s=30).time_limit_s == 30


@pytest.mark.parametrize("limit", [0, 121])
def test_it_refuses_a_time_limit_outside_the_trainers(project, owner, export, base_policy, limit):
    with pytest.raises(InvalidInput, match=r"time_limit_s must lie in \[1, 120\]"):
        make_run(project, owner, export, base_policy, time_limit_s=limit)
    assert not TrainingRun.objects.exists()


def test_it_refuses_an_export_that_is_not_ready(
    project, owner, seed_candidate, humaneval_suite, base_policy
):
    run_evaluation(seed_candidate, humaneval_suite, base_policy, results=[PASS])
    pending = trajectory_export_create(project=project, format="chat", created_by=owner)
    with pytest.raises(InvalidState, match="a run needs a ready export"):
        make_run(project, owner, pending, base_policy)


def test_it_refuses_an_export_without_rows(
    project, owner, seed_candidate, humaneval_suite, base_policy
):
    run_evaluation(seed_candidate, humaneval_suite, base_policy, results=[FAIL, FAIL])
    empty = build(
        trajectory_export_create(
            project=project, format="chat", created_by=owner, successful_only=True
        )
    )
    assert (empty.state, empty.rows) == ("ready", 0)
    with pytest.raises(InvalidInput, match="holds no rows: there is nothing to train on"):
        make_run(project, owner, empty, base_policy)


def test_it_refuses_a_parent_policy_not_served_by_vllm(
    project, owner, export, base_policy, policy_version
):
    assert policy_version.endpoint.kind == EndpointKind.OPENAI_COMPATIBLE
    with pytest.raises(
        InvalidInput,
        match="only by a vLLM endpoint started with --enable-lora or by a llama.cpp endpoint",
    ):
        make_run(project, owner, export, policy_version)
    assert not TrainingRun.objects.exists()


def test_it_refuses_a_disabled_trainer(project, owner, export, base_policy):
    trainer = make_trainer()
    Trainer.objects.filter(id=trainer.id).update(enabled=False)
    trainer.refresh_from_db()
    with pytest.raises(InvalidInput, match="disabled"):
        make_run(project, owner, export, base_policy, trainer=trainer)


def test_it_refuses_an_export_of_another_project(project, owner, export, base_policy):
    from coevo.projects.services import project_get_or_create

    other = project_get_or_create(slug="other", name="Other")
    with pytest.raises(InvalidInput, match="is not in project other"):
        training_run_create(
            project=other, trainer=make_trainer(), export=export, parent_policy=base_policy
        )


# --- training_run_execute --------------------------------------------------------------------


def test_a_run_registers_its_adapter_as_a_child_policy_version(
    project, owner, export, base_policy, dirs, settings, finished_signals
):
    run = make_run(project, owner, export, base_policy)
    done = training_run_execute(run_id=run.id)

    assert done.state == TrainingState.SUCCEEDED, done.state_detail
    assert done.exit_code == 0
    assert done.started_at and done.finished_at and done.heartbeat_at
    data = export_path(sha256=export.sha256)
    assert done.command == [sys.executable, TRAINER, "--data", str(data), "--base", "base-model",
                            "--out", str(dirs / "training" / str(run.id) / "output")]  # fmt: skip
    assert done.run_dir == str(dirs / "training" / str(run.id))
    # The log names the trainer, not its argv: every member reads the log, only operators the
    # command (docs/threat-model.md).
    first_line = done.log_tail.splitlines()[0]
    assert first_line == f"coevo: training run {run.id} starts trainer {run.trainer.name}"
    assert "loaded 4 rows" in done.log_tail and "saved adapter" in done.log_tail
    assert done.log_bytes == (Path(done.run_dir) / "train.log").stat().st_size

    version = done.policy_version
    assert version.parent == base_policy
    assert version.endpoint == base_policy.endpoint
    assert version.base_model == "base-model"
    assert version.name == version.adapter_name == version.served_name
    assert version.name.startswith("base-tiny-lora-")
    installed = Path(version.adapter_path)
    assert installed == Path(settings.COEVO_ADAPTER_DIR) / version.adapter_name
    weights = installed / "adapter_model.safetensors"
    assert weights.is_file() and stat.S_IMODE(weights.stat().st_mode) == 0o444
    assert weights.read_bytes() == (Path(done.run_dir) / "output" / weights.name).read_bytes()

    provenance = version.provenance
    assert set(provenance) == {
        "created_at", "training_run", "trainer", "trainer_command", "export", "export_sha256",
        "export_filters", "output_dir", "adapter_sha256", "adapter_rank", "log_sha256",
    }  # fmt: skip
    assert provenance["training_run"] == str(run.id)
    assert provenance["trainer"] == "tiny-lora"
    assert provenance["trainer_command"] == done.command
    assert provenance["export"] == str(export.id)
    assert provenance["export_sha256"] == export.sha256
    assert provenance["export_filters"] == export.filters
    assert provenance["adapter_sha256"] == done.adapter_sha256 and len(done.adapter_sha256) == 64
    assert provenance["adapter_rank"] == 4
    log = (Path(done.run_dir) / "train.log").read_bytes()
    assert provenance["log_sha256"] == hashlib.sha256(log).hexdigest()
    assert f"registered as policy version {version.name}" in done.state_detail

    event = AuditEvent.objects.get(action="policy.registered")
    assert event.target_id == version.name and event.actor_id == owner.id
    assert finished_signals == [(run.id, TrainingState.SUCCEEDED)]


def test_a_second_execution_of_the_same_run_does_nothing(
    project, owner, export, base_policy, finished_signals
):
    run = make_run(project, owner, export, base_policy)
    first = training_run_execute(run_id=run.id)
    assert first.state == TrainingState.SUCCEEDED
    assert training_run_execute(run_id=run.id) is None
    assert PolicyVersion.objects.filter(parent=base_policy).count() == 1
    assert len(finished_signals) == 1
    again = TrainingRun.objects.get(id=run.id)
    assert (again.state, again.finished_at) == (first.state, first.finished_at)


def test_the_same_export_gives_the_same_adapter_bytes(project, owner, export, base_policy):
    trainer = make_trainer()
    one = training_run_execute(run_id=make_run(project, owner, export, base_policy, trainer).id)
    two = training_run_execute(run_id=make_run(project, owner, export, base_policy, trainer).id)
    assert one.policy_version != two.policy_version
    assert one.adapter_sha256 == two.adapter_sha256


def test_a_trainer_that_exits_nonzero_fails_the_run(
    project, owner, export, base_policy, settings, finished_signals
):
    run = make_run(project, owner, export, base_policy, make_trainer("--fail"))
    done = training_run_execute(run_id=run.id)
    assert done.state == TrainingState.FAILED
    assert done.exit_code == 3
    assert done.state_detail == "the command exited with status 3; the log's end says why"
    assert "diverged: loss is nan" in done.log_tail
    assert done.policy_version is None
    assert not PolicyVersion.objects.filter(parent=base_policy).exists()
    assert not Path(settings.COEVO_ADAPTER_DIR).exists() or not any(
        Path(settings.COEVO_ADAPTER_DIR).iterdir()
    )
    assert finished_signals == [(run.id, TrainingState.FAILED)]


def test_an_output_without_weights_fails_the_run_as_not_an_adapter(
    project, owner, export, base_policy, settings
):
    run = make_run(project, owner, export, base_policy, make_trainer("--no-weights"))
    done = training_run_execute(run_id=run.id)
    assert done.state == TrainingState.FAILED
    assert done.exit_code == 0
    assert done.state_detail.startswith("the output is not a usable adapter: No weights")
    assert done.policy_version is None
    assert not PolicyVersion.objects.filter(parent=base_policy).exists()
    assert not Path(settings.COEVO_ADAPTER_DIR).exists() or not any(
        Path(settings.COEVO_ADAPTER_DIR).iterdir()
    )


def test_an_adapter_for_another_base_model_fails_the_run(project, owner, export, base_policy):
    command = [sys.executable, TRAINER, "--data", "{export}", "--base", "other-model",
               "--out", "{output_dir}"]  # fmt: skip
    trainer = trainer_register(name="wrong-base", command=command, time_limit_s=120)
    done = training_run_execute(run_id=make_run(project, owner, export, base_policy, trainer).id)
    assert done.state == TrainingState.FAILED
    assert "trained on 'other-model'" in done.state_detail


def test_a_run_past_its_time_limit_is_stopped_and_fails(project, owner, export, base_policy):
    run = make_run(
        project, owner, export, base_policy, make_trainer("--sleep", "60"), time_limit_s=1
    )
    done = training_run_execute(run_id=run.id)
    assert done.state == TrainingState.FAILED
    assert done.state_detail == "time limit of 1 s exceeded: the command was stopped"
    assert done.exit_code is None
    assert "epoch 1/2" in done.log_tail and "saved adapter" not in done.log_tail
    assert done.policy_version is None


def test_a_run_whose_export_file_is_gone_fails_with_the_reason(project, owner, export, base_policy):
    run = make_run(project, owner, export, base_policy)
    export_path(sha256=export.sha256).unlink()
    done = training_run_execute(run_id=run.id)
    assert done.state == TrainingState.FAILED
    assert "The export's file" in done.state_detail and "is missing" in done.state_detail


def test_the_trainer_does_not_see_the_workers_credentials(
    project, owner, export, base_policy, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", "postgres://coevo:hunter2@db/coevo")
    monkeypatch.setenv("COEVO_SECRET_KEY", "not-for-trainers")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://:pw@redis/0")
    trainer = make_trainer("--print-env", env={"WANDB_MODE": "offline"})
    done = training_run_execute(run_id=make_run(project, owner, export, base_policy, trainer).id)
    assert done.state == TrainingState.SUCCEEDED, done.state_detail
    line = next(ln for ln in done.log_tail.splitlines() if ln.startswith("env:"))
    names = set(line.split()[1:])
    assert not {"DATABASE_URL", "COEVO_SECRET_KEY", "CELERY_BROKER_URL"} & names
    assert {"PATH", "WANDB_MODE", "COEVO_EXPORT_PATH", "COEVO_EXPORT_FORMAT", "COEVO_BASE_MODEL",
            "COEVO_PARENT_ADAPTER", "COEVO_OUTPUT_DIR", "COEVO_RUN_DIR"} <= names  # fmt: skip


# --- cancel ----------------------------------------------------------------------------------


def test_cancelling_a_pending_run_ends_it_before_it_starts(
    project, owner, export, base_policy, finished_signals
):
    run = make_run(project, owner, export, base_policy)
    cancelled = training_run_cancel(run=run, actor=owner)
    assert cancelled.state == TrainingState.CANCELLED
    assert cancelled.state_detail == "cancelled before it started"
    assert training_run_execute(run_id=run.id) is None
    assert not (Path(cancelled.run_dir or "/nonexistent") / "train.log").exists()
    assert AuditEvent.objects.filter(action="training.cancelled", actor=owner).count() == 1
    assert finished_signals == [(run.id, TrainingState.CANCELLED)]
    with pytest.raises(InvalidState, match="nothing to cancel"):
        training_run_cancel(run=cancelled)


def test_cancelling_a_running_run_stops_its_command(
    project, owner, export, base_policy, finished_signals
):
    run = make_run(project, owner, export, base_policy, make_trainer("--sleep", "60"))
    thread, result = execute_in_thread(run.id)
    wait_for(lambda: "epoch 1/2" in TrainingRun.objects.get(id=run.id).log_tail)

    requested = training_run_cancel(run=TrainingRun.objects.get(id=run.id), actor=owner)
    assert requested.state == TrainingState.RUNNING and requested.cancel_requested
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not isinstance(result[0], BaseException), result[0]

    done = TrainingRun.objects.get(id=run.id)
    assert done.state == TrainingState.CANCELLED
    assert done.state_detail == "cancelled: the command was stopped"
    assert done.exit_code is None and done.policy_version is None
    assert "saved adapter" not in done.log_tail
    assert finished_signals == [(run.id, TrainingState.CANCELLED)]


def test_a_database_blip_during_training_does_not_end_the_run(
    project, owner, export, base_policy, caplog
):
    run = make_run(
        project, owner, export, base_policy, make_trainer("--epochs", "4", "--sleep", "1.5")
    )
    thread, result = execute_in_thread(run.id)
    # Once the worker has reported progress, its database connection dies under it.
    wait_for(lambda: "epoch 1/4" in TrainingRun.objects.get(id=run.id).log_tail)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (terminated,) = cursor.fetchone()
    assert terminated >= 1
    thread.join(timeout=90)
    assert not thread.is_alive()
    assert not isinstance(result[0], BaseException), result[0]

    done = TrainingRun.objects.get(id=run.id)
    assert done.state == TrainingState.SUCCEEDED, done.state_detail
    assert "epoch 4/4" in done.log_tail and done.policy_version is not None
    assert f"training run {run.id}: could not record progress" in caplog.text


# --- watchdog --------------------------------------------------------------------------------


def test_the_watchdog_fails_a_running_run_whose_heartbeat_is_stale(
    project, owner, export, base_policy, settings, finished_signals
):
    trainer = make_trainer()
    stale = make_run(project, owner, export, base_policy, trainer)
    fresh = make_run(project, owner, export, base_policy, trainer)
    now = timezone.now()
    long_ago = now - timedelta(seconds=settings.COEVO_TRAINING_STALE_S + 5)
    TrainingRun.objects.filter(id=stale.id).update(
        state=TrainingState.RUNNING, started_at=long_ago, heartbeat_at=long_ago
    )
    TrainingRun.objects.filter(id=fresh.id).update(
        state=TrainingState.RUNNING, started_at=long_ago, heartbeat_at=now
    )

    assert training_runs_watchdog() == {"failed": 1, "resent": 0}
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.state == TrainingState.FAILED
    assert "stopped reporting" in stale.state_detail
    assert fresh.state == TrainingState.RUNNING
    assert finished_signals == [(stale.id, TrainingState.FAILED)]
    # It does not fail the same run twice.
    assert training_runs_watchdog() == {"failed": 0, "resent": 0}


def test_the_watchdog_reenqueues_an_old_pending_run_once_per_period(
    project, owner, export, base_policy, settings
):
    trainer = make_trainer()
    old = make_run(project, owner, export, base_policy, trainer)
    recent = make_run(project, owner, export, base_policy, trainer)
    long_ago = timezone.now() - timedelta(seconds=settings.COEVO_TRAINING_STALE_S + 5)
    TrainingRun.objects.filter(id=old.id).update(updated_at=long_ago, celery_task_id="")

    assert training_runs_watchdog() == {"failed": 0, "resent": 1}
    old.refresh_from_db()
    recent.refresh_from_db()
    assert old.state == TrainingState.PENDING
    assert old.celery_task_id and old.updated_at > long_ago
    assert recent.celery_task_id  # its own, from creation
    # Re-sent: not again until it is stale again.
    assert training_runs_watchdog() == {"failed": 0, "resent": 0}


def test_a_run_whose_message_was_lost_runs_once_the_watchdog_resends_it(
    request, project, owner, export, base_policy, settings
):
    # The worker starts once the export's rollouts were finished here (it would claim them).
    request.getfixturevalue("celery_worker_thread")
    # Created without its message (as if the broker lost it), and old enough to be re-sent.
    run = TrainingRun.objects.create(
        project=project,
        trainer=make_trainer(),
        export=export,
        parent_policy=base_policy,
        time_limit_s=60,
    )
    long_ago = timezone.now() - timedelta(seconds=settings.COEVO_TRAINING_STALE_S + 5)
    TrainingRun.objects.filter(id=run.id).update(updated_at=long_ago)

    assert training_runs_watchdog()["resent"] == 1
    wait_for(lambda: TrainingRun.objects.get(id=run.id).is_final, timeout_s=90)
    run.refresh_from_db()
    assert run.state == TrainingState.SUCCEEDED, run.state_detail
    assert run.policy_version.parent == base_policy


def test_a_run_ended_by_the_watchdog_stops_its_command_and_registers_nothing(
    project, owner, export, base_policy, settings
):
    run = make_run(
        project, owner, export, base_policy, make_trainer("--epochs", "3", "--sleep", "2")
    )
    thread, result = execute_in_thread(run.id)
    wait_for(lambda: "epoch 1/3" in TrainingRun.objects.get(id=run.id).log_tail)
    later = timezone.now() + timedelta(seconds=settings.COEVO_TRAINING_STALE_S + 10)
    assert training_runs_watchdog(now=later)["failed"] == 1
    thread.join(timeout=60)
    done = TrainingRun.objects.get(id=run.id)
    assert done.state == TrainingState.FAILED
    assert "saved adapter" not in done.log_tail, "the command ran on after its run ended"
    assert done.policy_version is None, "a failed run registered a policy version"
    assert not PolicyVersion.objects.filter(parent=base_policy).exists()


@pytest.mark.parametrize("arg", ["{export!z}", "{export:d}", "{run_dir:>{width}}"])
def test_it_refuses_a_placeholder_that_cannot_be_filled_in(db, arg):
    with pytest.raises(InvalidInput):
        trainer_register(name="t", command=["train", arg])
    assert not Trainer.objects.exists()


# --- llama.cpp parents: the adapter written as GGUF, loaded once, installed with the rest -----


def gemma_trainer(gemma_shapes, *extra: str):
    """The tiny trainer writing an r=8 attention LoRA shaped for Gemma 3 270M (18 blocks)."""
    spec = ",".join(f"{m}={gemma_shapes[m][0]}x{gemma_shapes[m][1]}" for m in ATTENTION)
    return make_trainer(
        "--lora-shapes", spec, "--layers", "18", "--rank", "8", *extra, name="tiny-gemma"
    )


def test_a_run_on_a_llama_cpp_parent_registers_its_adapter_with_its_gguf(
    project, owner, export, llamacpp_policy, gemma_shapes, gemma_gguf, gemma_layout, settings
):
    run = make_run(project, owner, export, llamacpp_policy, gemma_trainer(gemma_shapes))
    done = training_run_execute(run_id=run.id)

    assert done.state == TrainingState.SUCCEEDED, done.state_detail
    assert "loaded by llama.cpp" in done.state_detail
    version = done.policy_version
    assert version.parent == llamacpp_policy
    assert version.endpoint == llamacpp_policy.endpoint
    assert version.base_model == "gemma-3-270m"
    installed = Path(version.adapter_path)
    assert installed == Path(settings.COEVO_ADAPTER_DIR) / version.adapter_name
    assert sorted(p.name for p in installed.iterdir()) == [
        "adapter.gguf", "adapter_config.json", "adapter_model.safetensors",
    ]  # fmt: skip
    gguf_file = installed / "adapter.gguf"
    assert stat.S_IMODE(gguf_file.stat().st_mode) == 0o444
    digest = hashlib.sha256(gguf_file.read_bytes()).hexdigest()

    provenance = version.provenance
    assert provenance["adapter_sha256"] == done.adapter_sha256
    recorded = provenance["adapter_gguf"]
    assert recorded == {
        "file": "adapter.gguf",
        "sha256": digest,
        "size_bytes": gguf_file.stat().st_size,
        "tensors": 144,
        "modules": 72,
        "rank": 8,
        "alpha": 16.0,
        "architecture": "gemma3",
        "base_gguf": str(gemma_gguf),
        "base_gguf_sha256": gemma_layout.sha256,
        "load_check_text": recorded["load_check_text"],
    }
    assert recorded["load_check_text"].strip()


def test_the_gguf_is_covered_by_the_installed_adapters_sha256(
    project, owner, export, base_policy, llamacpp_policy, gemma_shapes
):
    # The same trainer output installed for vLLM (no GGUF) and for llama.cpp (with it).
    trainer = gemma_trainer(gemma_shapes)
    vllm = training_run_execute(run_id=make_run(project, owner, export, base_policy, trainer).id)
    llama = training_run_execute(
        run_id=make_run(project, owner, export, llamacpp_policy, trainer).id
    )
    assert vllm.state == llama.state == TrainingState.SUCCEEDED, llama.state_detail
    assert not (Path(vllm.policy_version.adapter_path) / "adapter.gguf").exists()
    assert "adapter_gguf" not in vllm.policy_version.provenance
    assert vllm.adapter_sha256 != llama.adapter_sha256


def test_a_llama_cpp_parent_whose_base_has_no_gguf_fails_the_run(
    project, owner, export, llamacpp_policy, settings
):
    parent = policy_version_create(
        name="unconverted", endpoint=llamacpp_policy.endpoint, base_model="base-model"
    )
    done = training_run_execute(run_id=make_run(project, owner, export, parent).id)
    assert done.state == TrainingState.FAILED
    assert done.state_detail.startswith(
        "the adapter could not be made ready for llama.cpp: No GGUF file for the base model "
        "'base-model'"
    )
    assert done.policy_version is None
    assert not PolicyVersion.objects.filter(parent=parent).exists()
    assert not Path(settings.COEVO_ADAPTER_DIR).exists() or not any(
        Path(settings.COEVO_ADAPTER_DIR).iterdir()
    )


def test_an_adapter_llama_cpp_cannot_take_fails_the_run_and_registers_nothing(
    project, owner, export, llamacpp_policy, settings
):
    # The default tiny adapter: a valid PEFT LoRA, but of 4x4 matrices, not Gemma's.
    done = training_run_execute(run_id=make_run(project, owner, export, llamacpp_policy).id)
    assert done.state == TrainingState.FAILED
    assert done.state_detail.startswith(
        "the adapter could not be made ready for llama.cpp: adapter_model.safetensors: "
        "base_model.model.layers.0.self_attn.q_proj.lora_A.weight has shape [4, 4], but rank 4 "
        "on blk.0.attn_q.weight [1024, 640] (out, in) needs [4, 640]"
    )
    assert done.policy_version is None
    assert not PolicyVersion.objects.filter(parent=llamacpp_policy).exists()
    assert not Path(settings.COEVO_ADAPTER_DIR).exists() or not any(
        Path(settings.COEVO_ADAPTER_DIR).iterdir()
    )
