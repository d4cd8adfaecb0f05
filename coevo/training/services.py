"""Trainers and training runs: register a trainer, create a run on an export, execute it on a
training worker (command → adapter checked → installed → PolicyVersion), cancel, watchdog."""

from __future__ import annotations

import hashlib
import logging
import shutil
import string
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.errors import CoevoError, InvalidInput, InvalidState
from coevo.exports.models import ExportState, TrajectoryExport
from coevo.exports.services import export_path
from coevo.policies.models import EndpointKind, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Project
from coevo.training.adapters import adapter_install, adapter_validate
from coevo.training.models import (
    TRAINING_OPEN_STATES,
    Trainer,
    TrainingRun,
    TrainingState,
)
from coevo.training.process import command_run, log_tail, trainer_environment
from coevo.training.signals import training_finished

logger = logging.getLogger(__name__)

# The placeholders a trainer's argv may use, and the environment variable carrying each.
PLACEHOLDERS = {
    "export": "COEVO_EXPORT_PATH",
    "format": "COEVO_EXPORT_FORMAT",
    "base_model": "COEVO_BASE_MODEL",
    "parent_adapter": "COEVO_PARENT_ADAPTER",
    "output_dir": "COEVO_OUTPUT_DIR",
    "run_dir": "COEVO_RUN_DIR",
}
MAX_TIME_LIMIT_S = 7 * 24 * 3600


# --- trainers ------------------------------------------------------------------------------


def trainer_register(
    *,
    name: str,
    command: list[str],
    time_limit_s: int = 3600,
    env: dict[str, str] | None = None,
    description: str = "",
    replace: bool = False,
) -> Trainer:
    """Register (or, with ``replace``, update) a trainer. Operators only: the command runs on
    the training worker outside any sandbox."""
    env = env or {}
    trainer_validate(command=command, time_limit_s=time_limit_s, env=env)
    defaults = {
        "command": command,
        "time_limit_s": time_limit_s,
        "env": env,
        "description": description,
        "enabled": True,
    }
    with transaction.atomic():
        existing = Trainer.objects.select_for_update().filter(name=name).first()
        if existing is not None and not replace:
            raise InvalidInput(f"A trainer named {name} exists; pass replace to update it.")
        if existing is None:
            trainer = Trainer(name=name, **defaults)
            try:
                trainer.full_clean()
            except ValidationError as exc:
                raise InvalidInput(
                    "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
                ) from exc
            trainer.save()
        else:
            for key, value in defaults.items():
                setattr(existing, key, value)
            existing.save()
            trainer = existing
        trainer_audit(trainer=trainer, actor=None, action="trainer.registered")
    return trainer


def trainer_validate(*, command: Any, time_limit_s: int, env: Any) -> None:
    """What every way of defining a trainer (this module, the admin) checks first."""
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidInput("A trainer's command is a non-empty list of strings (an argv).")
    for arg in command:
        _placeholders_check(arg)
    if not isinstance(time_limit_s, int) or not 1 <= time_limit_s <= MAX_TIME_LIMIT_S:
        raise InvalidInput(f"time_limit_s must lie in [1, {MAX_TIME_LIMIT_S}].")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidInput("A trainer's env maps names to strings.")
    clashing = sorted(set(env) & set(PLACEHOLDERS.values()))
    if clashing:
        raise InvalidInput(f"env may not set {', '.join(clashing)}: coevo sets them per run.")


def trainer_audit(*, trainer: Trainer, actor: AbstractBaseUser | None, action: str) -> None:
    audit_record(
        actor=actor,
        project=None,
        action=action,
        target=trainer,
        after={
            "command": trainer.command,
            "time_limit_s": trainer.time_limit_s,
            "env": sorted(trainer.env),  # names only: values may be credentials
            "enabled": trainer.enabled,
        },
    )


def _placeholders_check(arg: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
    except ValueError as exc:
        raise InvalidInput(f"Trainer argument {arg!r}: {exc} (write {{{{ for a brace).") from exc
    unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
    if unknown:
        raise InvalidInput(
            f"Trainer argument {arg!r} uses unknown placeholder(s) {unknown}; known: "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}."
        )


def trainer_get(*, name: str) -> Trainer:
    trainer = Trainer.objects.filter(name=name).first()
    if trainer is None:
        known = ", ".join(Trainer.objects.filter(enabled=True).values_list("name", flat=True))
        raise InvalidInput(
            f"No trainer named {name!r} (registered: {known or 'none'}). An operator registers "
            "one with `manage.py trainer_register` (docs/training.md)."
        )
    if not trainer.enabled:
        raise InvalidInput(f"The trainer {name} is disabled.")
    return trainer


# --- runs ----------------------------------------------------------------------------------


def training_run_create(
    *,
    project: Project,
    trainer: Trainer,
    export: TrajectoryExport,
    parent_policy: PolicyVersion,
    time_limit_s: int | None = None,
    created_by: AbstractBaseUser | None = None,
) -> TrainingRun:
    """A pending run of ``trainer`` on a ready ``export``, enqueued (on commit) on the
    ``training`` queue. ``time_limit_s`` may only lower the trainer's limit."""
    if export.project_id != project.id:
        raise InvalidInput(f"Export {export.id} is not in project {project.slug}.")
    if export.state != ExportState.READY:
        raise InvalidState(f"Export {export.id} is {export.state}: a run needs a ready export.")
    if export.rows == 0:
        raise InvalidInput(
            f"Export {export.id} holds no rows: there is nothing to train on (its filters "
            f"matched {export.rollouts} rollout(s))."
        )
    if not trainer.enabled:
        raise InvalidInput(f"The trainer {trainer.name} is disabled.")
    if parent_policy.endpoint.kind != EndpointKind.VLLM:
        raise InvalidInput(
            f"Policy version {parent_policy.name} is served by {parent_policy.endpoint.name} "
            f"({parent_policy.endpoint.get_kind_display()}): a trained LoRA adapter is loaded "
            "at run time only by a vLLM endpoint started with --enable-lora (docs/training.md)."
        )
    limit = trainer.time_limit_s if time_limit_s is None else time_limit_s
    if not 1 <= limit <= trainer.time_limit_s:
        raise InvalidInput(
            f"time_limit_s must lie in [1, {trainer.time_limit_s}] (the trainer's own limit)."
        )
    with transaction.atomic():
        run = TrainingRun.objects.create(
            project=project,
            trainer=trainer,
            export=export,
            parent_policy=parent_policy,
            time_limit_s=limit,
            created_by=created_by,
        )
        audit_record(
            actor=created_by,
            project=project,
            action="training.created",
            target=run,
            after={
                "trainer": trainer.name,
                "export": str(export.id),
                "parent_policy": parent_policy.name,
                "time_limit_s": limit,
            },
        )
        transaction.on_commit(lambda: training_run_enqueue(run=run))
    logger.info("training run %s created: %s on export %s", run.id, trainer.name, export.id)
    return run


def training_run_enqueue(*, run: TrainingRun) -> None:
    from coevo.training.tasks import training_run_execute as task

    try:
        # Per-call limits: above the run's own, which the service enforces with a clean stop.
        result = task.apply_async(
            args=[str(run.id)],
            queue="training",
            soft_time_limit=run.time_limit_s + 120,
            time_limit=run.time_limit_s + 300,
        )
    except Exception as exc:  # kombu's errors differ by transport
        logger.warning("training run %s: could not enqueue (%s); the watchdog will", run.id, exc)
        return
    TrainingRun.objects.filter(id=run.id).update(celery_task_id=result.id or "")


def training_run_dir(run: TrainingRun) -> Path:
    return Path(settings.COEVO_TRAINING_DIR) / str(run.id)


def training_run_execute(*, run_id: Any) -> TrainingRun | None:
    """Run the trainer (pending → running → succeeded/failed/cancelled). A second delivery of
    the same run finds it claimed and does nothing."""
    now = timezone.now()
    claimed = TrainingRun.objects.filter(id=run_id, state=TrainingState.PENDING).update(
        state=TrainingState.RUNNING, started_at=now, heartbeat_at=now, updated_at=now
    )
    if claimed != 1:
        return None
    run = TrainingRun.objects.select_related("trainer", "export", "parent_policy", "project").get(
        id=run_id
    )
    try:
        return _execute(run)
    except Exception as exc:  # anything unexpected still ends the run, with the reason
        logger.exception("training run %s failed", run.id)
        _finish(run, TrainingState.FAILED, f"{type(exc).__name__}: {exc}")
        return TrainingRun.objects.get(id=run.id)


def _execute(run: TrainingRun) -> TrainingRun:
    run_dir = training_run_dir(run)
    output = run_dir / "output"
    shutil.rmtree(run_dir, ignore_errors=True)
    output.mkdir(parents=True)
    log_path = run_dir / "train.log"
    parent = run.parent_policy
    data = export_path(sha256=run.export.sha256)
    if not data.is_file():
        return _finish(run, TrainingState.FAILED, f"The export's file {data} is missing.")
    values = {
        "export": str(data),
        "format": run.export.format,
        "base_model": parent.base_model,
        "parent_adapter": parent.adapter_path,
        "output_dir": str(output),
        "run_dir": str(run_dir),
    }
    argv = [arg.format_map(values) for arg in run.trainer.command]
    env = trainer_environment(
        extra=run.trainer.env,
        inputs={PLACEHOLDERS[k]: v for k, v in values.items()},
    )
    TrainingRun.objects.filter(id=run.id).update(
        command=argv, run_dir=str(run_dir), updated_at=timezone.now()
    )
    log_path.write_text(f"$ {' '.join(argv)}\n")
    limit = settings.COEVO_TRAINING_LOG_TAIL

    def tick() -> bool:
        tail, size = log_tail(log_path, limit)
        try:
            TrainingRun.objects.filter(id=run.id).update(
                log_tail=tail, log_bytes=size, heartbeat_at=timezone.now()
            )
            return TrainingRun.objects.filter(id=run.id, cancel_requested=True).exists()
        except DatabaseError as exc:
            # A database blip must not kill hours of training; the next tick tries again
            # (and the watchdog fails the run if the blip outlasts COEVO_TRAINING_STALE_S).
            logger.warning("training run %s: could not record progress (%s)", run.id, exc)
            close_old_connections()
            return False

    finished = command_run(
        argv=argv,
        cwd=run_dir,
        env=env,
        log_path=log_path,
        time_limit_s=run.time_limit_s,
        on_tick=tick,
    )
    tail, size = log_tail(log_path, limit)
    TrainingRun.objects.filter(id=run.id).update(
        log_tail=tail, log_bytes=size, exit_code=finished.exit_code
    )
    if finished.reason.startswith("cancelled"):
        return _finish(run, TrainingState.CANCELLED, finished.reason)
    if finished.reason:
        return _finish(run, TrainingState.FAILED, finished.reason)
    if finished.exit_code != 0:
        return _finish(
            run,
            TrainingState.FAILED,
            f"the command exited with status {finished.exit_code}; the log's end says why",
        )
    try:
        info = adapter_validate(directory=output, base_model=parent.base_model)
        name = _adapter_name(run)
        installed, sha256 = adapter_install(source=output, name=name)
    except CoevoError as exc:
        return _finish(run, TrainingState.FAILED, f"the output is not a usable adapter: {exc}")
    with transaction.atomic():
        version = policy_version_create(
            name=name,
            endpoint=parent.endpoint,
            adapter_name=name,
            adapter_path=str(installed),
            parent=parent,
            replicas=list(parent.replicas.all()),
            provenance={
                "training_run": str(run.id),
                "trainer": run.trainer.name,
                "trainer_command": argv,
                "export": str(run.export.id),
                "export_sha256": run.export.sha256,
                "export_filters": run.export.filters,
                "output_dir": str(output),
                "adapter_sha256": sha256,
                "adapter_rank": info.rank,
                "log_sha256": _file_sha256(log_path),
            },
        )
        TrainingRun.objects.filter(id=run.id).update(policy_version=version, adapter_sha256=sha256)
        audit_record(
            actor=run.created_by,
            project=run.project,
            action="policy.registered",
            target=version,
            after={"parent": parent.name, "adapter_path": str(installed), "sha256": sha256},
        )
        run = _finish(
            run,
            TrainingState.SUCCEEDED,
            f"adapter {name} (rank {info.rank}, {info.tensors} tensor(s), "
            f"{info.size_bytes:,} bytes) registered as policy version {version.name}",
        )
    return run


def _adapter_name(run: TrainingRun) -> str:
    # A slug (PolicyVersion.name) that is also the adapter's served name and directory name.
    return f"{run.parent_policy.name[:60]}-{run.trainer.name[:24]}-{run.id.hex[:8]}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _finish(run: TrainingRun, state: str, detail: str) -> TrainingRun:
    now = timezone.now()
    moved = TrainingRun.objects.filter(id=run.id, state__in=TRAINING_OPEN_STATES).update(
        state=state, state_detail=detail[:5000], finished_at=now, updated_at=now
    )
    if moved:
        logger.info("training run %s %s: %s", run.id, state, detail)
        transaction.on_commit(
            lambda: training_finished.send(sender=TrainingRun, run_id=run.id, state=state)
        )
    return TrainingRun.objects.get(id=run.id)


def training_run_cancel(*, run: TrainingRun, actor: AbstractBaseUser | None = None) -> TrainingRun:
    """A pending run ends at once; a running one is stopped by its worker within a tick."""
    with transaction.atomic():
        if TrainingRun.objects.filter(id=run.id, state=TrainingState.PENDING).exists():
            run = _finish(run, TrainingState.CANCELLED, "cancelled before it started")
        elif TrainingRun.objects.filter(id=run.id, state=TrainingState.RUNNING).update(
            cancel_requested=True, updated_at=timezone.now()
        ):
            run = TrainingRun.objects.get(id=run.id)
        else:
            raise InvalidState(f"Training run {run.id} is {run.state}: nothing to cancel.")
        audit_record(actor=actor, project=run.project, action="training.cancelled", target=run)
    return run


def training_runs_watchdog(*, now: Any = None) -> dict[str, int]:
    """Fail running runs whose worker stopped heartbeating (killed: the command died with it);
    re-enqueue pending ones whose message may be lost (a second delivery is a no-op)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.COEVO_TRAINING_STALE_S)
    failed = 0
    for run in TrainingRun.objects.filter(state=TrainingState.RUNNING, heartbeat_at__lt=stale):
        with transaction.atomic():
            before = run.state
            run = _finish(
                run,
                TrainingState.FAILED,
                f"the training worker stopped reporting (no heartbeat since "
                f"{run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC): it was probably killed; the run "
                "is not restarted on its own",
            )
            failed += before != run.state
    resent = 0
    for run in TrainingRun.objects.filter(state=TrainingState.PENDING, updated_at__lt=stale):
        TrainingRun.objects.filter(id=run.id).update(updated_at=now)
        training_run_enqueue(run=run)
        resent += 1
    return {"failed": failed, "resent": resent}


def training_run_log_path(*, run: TrainingRun) -> Path | None:
    """The full log, when it is on this machine (the training worker's disk)."""
    if not run.run_dir:
        return None
    path = Path(run.run_dir) / "train.log"
    return path if path.is_file() else None


__all__ = [
    "PLACEHOLDERS",
    "trainer_audit",
    "trainer_get",
    "trainer_register",
    "trainer_validate",
    "training_run_cancel",
    "training_run_create",
    "training_run_execute",
    "training_run_log_path",
    "training_runs_watchdog",
]
