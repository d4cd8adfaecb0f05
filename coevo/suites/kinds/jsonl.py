"""Custom (JSONL) suites on the platform: a file of tasks with a declared scorer, uploaded on
the dashboard or read from disk by the command line (coevo/suites/jsonl.py parses it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django import forms
from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Project
from coevo.suites.jsonl import MAX_FILE_BYTES, SCORERS, SuiteImportError, scorer_spec_build
from coevo.suites.kinds.base import (
    CommandImport,
    Imported,
    PlatformKind,
    Progress,
    UploadImport,
    register_suite_kind,
    split_seed_argument,
)
from coevo.suites.models import SuiteKind
from coevo.suites.services import suite_import_jsonl


class JsonlImportForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="lowercase letters, digits, - and _")
    file = forms.FileField(help_text="one JSON object per line: id, input, expected, …")
    scorer = forms.ChoiceField(choices=[(s, s) for s in SCORERS])
    tolerance = forms.FloatField(required=False, help_text="numeric: absolute tolerance")
    rel_tolerance = forms.FloatField(required=False, help_text="numeric: relative tolerance")
    verifier = forms.FileField(
        required=False, help_text="python: a .py module with score(answer, expected, metadata)"
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    split_seed = forms.CharField(max_length=64, initial="0", required=False)


DESCRIPTION = (
    "One JSON object per line: <code>id</code> (string, unique), <code>input</code> (string or "
    "object: what the harness sees), <code>expected</code> (never shown to the harness), "
    "optional <code>metadata</code> (object) and <code>split</code> (search, validation or "
    "heldout; otherwise assigned by a hash of the id and the split seed). At most "
    "{max_megabytes} MB."
)
NOTES = (
    "Scorers: <b>exact</b> (equal after trimming), <b>normalized</b> (ignoring case, whitespace and "
    "punctuation), <b>numeric</b> (the answer's last number within the tolerances), "
    r"<b>regex</b> (<code>expected</code> is an RE2 pattern the whole answer must match: no "
    r"lookaround or backreferences; <code>\d</code> and <code>\w</code> are ASCII, "
    r"<code>\p{L}</code> is any letter), <b>python</b> (your module's "
    "<code>score(answer, expected, metadata)</code> returns a bool or a number in [0, 1]; it "
    "runs sandboxed on the worker)."
)


def _upload_run(*, project: Project, data: dict[str, Any], actor: AbstractBaseUser) -> Imported:
    upload = data["file"]
    if upload.size > MAX_FILE_BYTES:
        raise SuiteImportError(
            [
                f"file: {upload.size / 1024**2:.1f} MiB is over the {MAX_FILE_BYTES // 1024**2} MiB "
                "limit; split it into several suites"
            ]
        )
    verifier = data["verifier"]
    scorer = scorer_spec_build(
        kind=data["scorer"],
        abs_tol=data["tolerance"],
        rel_tol=data["rel_tolerance"],
        verifier_name=verifier.name if verifier else "",
        verifier_source=verifier.read() if verifier else None,
    )
    suite, created = suite_import_jsonl(
        project=project,
        name=data["name"],
        data=upload.read(),
        scorer=scorer,
        description=data["description"],
        split_seed=data["split_seed"] or "0",
        actor=actor,
    )
    return Imported(suite, created)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the JSONL file: one task object per line")
    parser.add_argument("--name", required=True, help="suite name (lowercase, digits, - and _)")
    parser.add_argument(
        "--scorer",
        required=True,
        choices=["exact", "normalized", "numeric", "regex", "python"],
        help="how answers are scored",
    )
    parser.add_argument("--tolerance", type=float, default=None, help="numeric: absolute tolerance")
    parser.add_argument(
        "--rel-tolerance", type=float, default=None, help="numeric: relative tolerance"
    )
    parser.add_argument(
        "--verifier",
        type=Path,
        default=None,
        help="python: the verifier module, defining score(answer, expected, metadata)",
    )
    parser.add_argument("--description", default="", help="what the suite measures")
    split_seed_argument(parser)


def _command_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    verifier: Path | None = options["verifier"]
    scorer = scorer_spec_build(
        kind=options["scorer"],
        abs_tol=options["tolerance"],
        rel_tol=options["rel_tolerance"],
        verifier_name=verifier.name if verifier else "",
        verifier_source=_read(verifier, "verifier") if verifier else None,
    )
    suite, created = suite_import_jsonl(
        project=project,
        name=options["name"],
        data=_read(options["file"], "suite file"),
        scorer=scorer,
        description=options["description"],
        split_seed=options["split_seed"],
    )
    return Imported(suite, created)


def _read(path: Path, label: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SuiteImportError(
                [
                    f"{label} {path}: {size / 1024**2:.1f} MiB is over the "
                    f"{MAX_FILE_BYTES // 1024**2} MiB limit"
                ]
            )
        return path.read_bytes()
    except OSError as exc:
        raise SuiteImportError([f"{label} {path}: cannot read it ({exc.strerror})"]) from exc


@register_suite_kind
class JsonlKind(PlatformKind):
    kind = SuiteKind.JSONL
    commands = (
        CommandImport(
            "jsonl",
            "a custom suite from a JSONL file with a declared scorer",
            _arguments,
            _command_run,
        ),
    )
    uploads = (
        UploadImport(
            "jsonl",
            "Custom suite (JSONL)",
            JsonlImportForm,
            DESCRIPTION,
            _upload_run,
            notes=NOTES,
        ),
    )
