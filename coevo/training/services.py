"""Training runs: create a run on an export, execute it on a training worker (command →
adapter checked → for llama.cpp, written as GGUF and loaded once → installed → PolicyVersion),
cancel, watchdog. Trainers: coevo.training.trainers."""

from __future__ import annotations

import hashlib
import logging
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.enqueue import task_enqueue
from coevo.errors import CoevoError, InvalidInput, InvalidState
from coevo.exports.models import ExportState, TrajectoryExport
from coevo.exports.services import export_path
from coevo.policies.embedded import base_model_gguf
from coevo.policies.models import ADAPTER_ENDPOINT_KINDS, EndpointKind, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Project
from coevo.training.adapters import adapter_install, adapter_validate
from coevo.training.gguf_adapter import (
    GGUF_ADAPTER,
    adapter_gguf_load_check,
    adapter_gguf_write,
)
from coevo.training.models import (
    TRAINING_OPEN_STATES,
    Trainer,
    TrainingRun,
    TrainingState,
)
from coevo.training.process import command_run, log_tail, trainer_environment
from coevo.training.signals import training_finished
from coevo.training.trainers import PLACEHOLDERS

logger = logging.getLogger(__name__)

# Celery task names (coevo.training.tasks registers them; services send them by name).
TRAINING_RUN_EXECUTE_TASK = "coevo.training.tasks.training_run_execute"

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
    if parent_policy.endpoint.kind not in ADAPTER_ENDPOINT_KINDS:
        raise InvalidInput(
            f"Policy version {parent_policy.name} is served by {parent_policy.endpoint.name} "
            f"({parent_policy.endpoint.get_kind_display()}): a trained LoRA adapter is loaded "
            "at run time only by a vLLM endpoint started with --enable-lora or by a llama.cpp "
            "endpoint (kind llamacpp); an OpenAI-compatible endpoint has no way to load one. "
            "Serve the base model from one of those and register it there (docs/training.md)."
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
    task_enqueue(
        TRAINING_RUN_EXECUTE_TASK,
        str(run.id),
        queue="training",
        what=f"training run {run.id}",
        later="the watchdog sends it again",
        record=lambda task_id: TrainingRun.objects.filter(id=run.id).update(celery_task_id=task_id),
        # Per-call limits: above the run's own, which the service enforces with a clean stop.
        soft_time_limit=run.time_limit_s + 120,
        time_limit=run.time_limit_s + 300,
    )


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
        "time_limit_s": str(run.time_limit_s),
    }
    argv = [arg.format_map(values) for arg in run.trainer.command]
    env = trainer_environment(
        extra=run.trainer.env,
        inputs={PLACEHOLDERS[k]: v for k, v in values.items()},
    )
    TrainingRun.objects.filter(id=run.id).update(
        command=argv, run_dir=str(run_dir), updated_at=timezone.now()
    )
    # Not the argv: the log is shown to every project member, the command only to operators
    # (it can name internal hosts, paths or credentials; docs/threat-model.md).
    log_path.write_text(f"coevo: training run {run.id} starts trainer {run.trainer.name}\n")
    limit = settings.COEVO_TRAINING_LOG_TAIL

    def tick() -> bool:
        tail, size = log_tail(log_path, limit)
        try:
            TrainingRun.objects.filter(id=run.id).update(
                log_tail=tail, log_bytes=size, heartbeat_at=timezone.now()
            )
            # Stop when cancelled, or when the run was ended from outside (the watchdog failed
            # it during a long database outage): nothing may come of a run that is over.
            return not TrainingRun.objects.filter(
                id=run.id, state=TrainingState.RUNNING, cancel_requested=False
            ).exists()
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
    if not _still_running(run):
        return TrainingRun.objects.get(id=run.id)
    try:
        info = adapter_validate(directory=output, base_model=parent.base_model)
    except CoevoError as exc:
        return _finish(run, TrainingState.FAILED, f"the output is not a usable adapter: {exc}")
    gguf_provenance: dict[str, Any] = {}
    if parent.endpoint.kind == EndpointKind.LLAMACPP:
        try:
            gguf_provenance = _llama_cpp_prepare(run, output)
        except CoevoError as exc:
            return _finish(
                run,
                TrainingState.FAILED,
                f"the adapter could not be made ready for llama.cpp: {exc}",
            )
        if not _still_running(run):
            return TrainingRun.objects.get(id=run.id)
    try:
        name = _adapter_name(run)
        installed, sha256 = adapter_install(source=output, name=name)
    except CoevoError as exc:
        return _finish(run, TrainingState.FAILED, f"the output is not a usable adapter: {exc}")
    with transaction.atomic():
        if not _still_running(run, lock=True):
            # Ended from outside while the adapter was checked: register nothing.
            return TrainingRun.objects.get(id=run.id)
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
                **gguf_provenance,
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
            f"{info.size_bytes:,} bytes{_gguf_note(gguf_provenance)}) registered as policy "
            f"version {version.name}",
        )
    return run


def _llama_cpp_prepare(run: TrainingRun, output: Path) -> dict[str, Any]:
    """Write the adapter as ``adapter.gguf`` beside the PEFT files (so the installed directory
    and its sha256 cover it) and have llama.cpp load it on the base model once; the
    provenance entry that records both."""
    base = base_model_gguf(run.parent_policy.base_model)
    # Reading the base model and loading it in llama.cpp take seconds to a minute; heartbeat
    # so the watchdog does not take this worker for dead meanwhile.
    _heartbeat(run)
    written = adapter_gguf_write(peft_dir=output, base_gguf=base, out=output / GGUF_ADAPTER)
    _heartbeat(run)
    text = adapter_gguf_load_check(base_gguf=base, adapter_gguf=written.path)
    _heartbeat(run)
    return {
        "adapter_gguf": {
            "file": GGUF_ADAPTER,
            "sha256": written.sha256,
            "size_bytes": written.size_bytes,
            "tensors": written.tensors,
            "modules": written.modules,
            "rank": written.rank,
            "alpha": written.alpha,
            "architecture": written.architecture,
            "base_gguf": written.base_gguf,
            "base_gguf_sha256": written.base_gguf_sha256,
            "load_check_text": text,
        }
    }


def _gguf_note(provenance: dict[str, Any]) -> str:
    if not provenance:
        return ""
    gguf = provenance["adapter_gguf"]
    return f"; as GGUF {gguf['size_bytes']:,} bytes, loaded by llama.cpp"


def _heartbeat(run: TrainingRun) -> None:
    TrainingRun.objects.filter(id=run.id).update(heartbeat_at=timezone.now())


def _still_running(run: TrainingRun, *, lock: bool = False) -> bool:
    runs = TrainingRun.objects.filter(id=run.id, state=TrainingState.RUNNING)
    return (runs.select_for_update() if lock else runs).exists()


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
    _transition(run, state, detail, from_states=TRAINING_OPEN_STATES)
    return TrainingRun.objects.get(id=run.id)


def _transition(run: TrainingRun, state: str, detail: str, *, from_states: tuple[str, ...]) -> bool:
    """Compare-and-swap into a final state; the signal goes once, on commit. True if it moved."""
    now = timezone.now()
    moved = TrainingRun.objects.filter(id=run.id, state__in=from_states).update(
        state=state, state_detail=detail[:5000], finished_at=now, updated_at=now
    )
    if moved:
        logger.info("training run %s %s: %s", run.id, state, detail)
        transaction.on_commit(
            lambda: training_finished.send(sender=TrainingRun, run_id=run.id, state=state)
        )
    return bool(moved)


def training_run_cancel(*, run: TrainingRun, actor: AbstractBaseUser | None = None) -> TrainingRun:
    """A pending run ends at once; a running one is stopped by its worker within a tick."""
    with transaction.atomic():
        pending_ended = _transition(
            run,
            TrainingState.CANCELLED,
            "cancelled before it started",
            from_states=(TrainingState.PENDING,),
        )
        running_asked = not pending_ended and TrainingRun.objects.filter(
            id=run.id, state=TrainingState.RUNNING
        ).update(cancel_requested=True, updated_at=timezone.now())
        if not (pending_ended or running_asked):
            raise InvalidState(f"Training run {run.id} is {run.state}: nothing to cancel.")
        run = TrainingRun.objects.get(id=run.id)
        audit_record(actor=actor, project=run.project, action="training.cancelled", target=run)
    return run


def training_runs_watchdog(*, now: Any = None) -> dict[str, int]:
    """Fail running runs whose worker stopped heartbeating (killed: the command died with it);
    re-enqueue pending ones whose message may be lost (a second delivery is a no-op)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.COEVO_TRAINING_STALE_S)
    failed = 0
    for run in TrainingRun.objects.filter(state=TrainingState.RUNNING, heartbeat_at__lt=stale):
        failed += _transition(
            run,
            TrainingState.FAILED,
            f"the training worker stopped reporting (no heartbeat since "
            f"{run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC): it was probably killed; the run "
            "is not restarted on its own",
            from_states=(TrainingState.RUNNING,),
        )
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
    "training_run_cancel",
    "training_run_create",
    "training_run_execute",
    "training_run_log_path",
    "training_runs_watchdog",
]
