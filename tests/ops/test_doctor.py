"""``coevo doctor``: each check names the problem and its fix; the exit code says broken or not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from coevo.cli import main
from coevo.policies.models import PolicyEndpoint, PolicyVersion
from harness_store.maintenance import repository_path
from tests.conftest import REPO_ROOT
from tests.support.net import free_port

pytestmark = pytest.mark.django_db


def doctor(capsys) -> tuple[int, dict[str, dict[str, str]]]:
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    return code, {check["name"]: check for check in report["checks"]}


@pytest.fixture
def path_without_bwrap(tmp_path, monkeypatch):
    """A PATH holding only git and python, as on a machine without bubblewrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "python3"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_it_names_bubblewrap_and_fails_on_a_machine_without_bwrap(
    path_without_bwrap, policy_version, capsys
):
    code, checks = doctor(capsys)

    assert code == 1
    sandbox = checks["sandbox"]
    assert sandbox["status"] == "fail"
    assert "bwrap" in sandbox["detail"]
    assert "apt-get install bubblewrap" in sandbox["fix"]
    # Only the sandbox is broken here.
    assert [name for name, c in checks.items() if c["status"] == "fail"] == ["sandbox"]


def test_the_table_shows_the_fix_next_to_the_failure(path_without_bwrap, policy_version, capsys):
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("sandbox"))
    assert "FAIL" in row and "apt-get install bubblewrap" in row
    assert "1 failed" in out


def test_missing_bwrap_is_a_warning_when_unsandboxed_runs_are_allowed(
    path_without_bwrap, policy_version, settings, capsys
):
    settings.COEVO_ALLOW_UNSANDBOXED = True
    code, checks = doctor(capsys)
    assert code == 0 and checks["sandbox"]["status"] == "warn"


def test_it_passes_on_a_healthy_installation(policy_version, seed_candidate, capsys):
    code, checks = doctor(capsys)

    assert code == 0, checks
    assert checks["sandbox"]["status"] == "ok"  # bwrap really ran a sandboxed program
    assert checks["harness store"]["detail"].startswith("1 repositories pass git fsck")
    assert checks["policy endpoints"]["status"] == "ok"
    for name in ("configuration", "python", "packages", "database", "migrations", "broker"):
        assert checks[name]["status"] == "ok", checks[name]


def test_it_fails_a_registered_policy_endpoint_that_does_not_answer(policy_version, capsys):
    down = PolicyEndpoint.objects.create(
        name="down", base_url=f"http://127.0.0.1:{free_port()}/v1", kind="vllm"
    )
    PolicyVersion.objects.create(name="down-v", base_model="m", served_name="m", endpoint=down)

    code, checks = doctor(capsys)
    assert code == 1
    assert checks["policy endpoints"]["status"] == "fail"
    assert down.base_url in checks["policy endpoints"]["detail"]


def test_it_fails_a_repository_that_is_gone(seed_candidate, policy_version, capsys):
    shutil.rmtree(repository_path(project=seed_candidate.project))
    code, checks = doctor(capsys)
    assert code == 1
    assert "demo" in checks["harness store"]["detail"]
    assert "harness_restore" in checks["harness store"]["fix"]


def test_it_fails_an_unreachable_broker(settings, policy_version, capsys):
    settings.CELERY_BROKER_URL = f"redis://:secret@127.0.0.1:{free_port()}/0"
    code, checks = doctor(capsys)
    assert code == 1 and checks["broker"]["status"] == "fail"
    assert "secret" not in checks["broker"]["detail"]


def test_it_warns_when_disk_space_is_low(settings, policy_version, capsys):
    settings.COEVO_DISK_WARN_GIB = 10**9
    code, checks = doctor(capsys)
    assert code == 0 and checks["disk"]["status"] == "warn" and checks["disk"]["fix"]
    settings.COEVO_DISK_FAIL_GIB = 10**9
    code, checks = doctor(capsys)
    assert code == 1 and checks["disk"]["status"] == "fail"


def test_a_bad_setting_is_a_configuration_failure_not_a_traceback(tmp_path):
    env = {**os.environ, "COEVO_HOME": str(tmp_path), "COEVO_HEARTBEAT_S": "soon"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from coevo.cli import main; sys.exit(main())",
            "doctor",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "configuration" in done.stdout and "COEVO_HEARTBEAT_S='soon'" in done.stdout
    assert "Traceback" not in done.stderr


def test_it_warns_about_a_home_other_local_users_can_read_with_the_chmod_that_fixes_it(
    settings, tmp_path, policy_version, capsys
):
    """As an earlier version left it (or a later chmod): with the usual umask, a 0755 home and
    a 0644 database, whose sessions another local user could log in with."""
    home = tmp_path / "home"
    (home / "broker" / "queue").mkdir(parents=True)
    database = home / "coevo.sqlite3"
    database.write_bytes(b"")
    for path, open_mode in ((home, 0o755), (home / "broker", 0o700), (database, 0o644)):
        path.chmod(open_mode)
    (home / "broker" / "queue").chmod(0o750)
    settings.COEVO_HOME = home

    code, checks = doctor(capsys)

    home_check = checks["home permissions"]
    assert code == 0 and home_check["status"] == "warn", home_check  # it works: a warning
    assert f"{home} (0755)" in home_check["detail"]
    assert f"{database} (0644)" in home_check["detail"]
    assert f"{home / 'broker' / 'queue'} (0750)" in home_check["detail"]
    assert f"chmod go= {home} {home / 'broker' / 'queue'} {database}" in home_check["fix"]

    subprocess.run(["sh", "-c", home_check["fix"].split("Run: ")[1].split(" (")[0]], check=True)
    code, checks = doctor(capsys)
    assert checks["home permissions"]["status"] == "ok", checks["home permissions"]


def doctor_subprocess(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from coevo.cli import main; sys.exit(main())"]
        + ["doctor", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_says_no_installation_is_here_and_creates_nothing_in_a_home_that_does_not_exist(
    tmp_path,
):
    home = tmp_path / "nowhere" / "home"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # the embedded default
    env["COEVO_HOME"] = str(home)

    done = doctor_subprocess(env)

    assert done.returncode == 1, done
    assert (
        f"no coevo installation here yet (COEVO_HOME {home} does not exist): run scripts/demo, "
        "or set COEVO_HOME / DATABASE_URL" in done.stdout
    )
    assert "migrations" not in done.stdout and "broken" not in done.stdout
    assert not (tmp_path / "nowhere").exists()  # no home, no var/coevo.sqlite3

    done = doctor_subprocess(env, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["ok"] is False
    assert [c["name"] for c in report["checks"]] == ["installation"]
    assert not (tmp_path / "nowhere").exists()


def test_it_says_no_installation_is_here_when_the_embedded_database_does_not_exist(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["COEVO_HOME"] = str(tmp_path)

    done = doctor_subprocess(env)

    assert done.returncode == 1, done
    assert f"the embedded database {tmp_path / 'coevo.sqlite3'} does not exist" in done.stdout
    assert "run scripts/demo, or set COEVO_HOME / DATABASE_URL" in done.stdout
    assert list(tmp_path.iterdir()) == []  # no database, no secret key, no broker folders


def test_the_demo_policy_server_down_is_a_warning_with_how_to_start_it_and_no_log_line(
    policy_version, capsys, caplog
):
    port = free_port()
    demo = PolicyEndpoint.objects.create(
        name="default-2", base_url=f"http://127.0.0.1:{port}/v1", kind="llamacpp"
    )
    PolicyVersion.objects.create(name="gemma", base_model="m", served_name="m", endpoint=demo)

    code, checks = doctor(capsys)
    policies = checks["policy endpoints"]
    assert code == 0 and policies["status"] == "warn", policies
    assert demo.base_url in policies["detail"] and "not running" in policies["detail"]
    assert "scripts/demo" in policies["fix"]
    assert "python -m coevo.policies.llamacpp_host" in policies["fix"]
    assert f"--port {port}" in policies["fix"]

    caplog.clear()
    assert main(["doctor"]) == 0
    captured = capsys.readouterr()
    assert "is unhealthy" not in captured.out + captured.err + caplog.text
    assert captured.out.startswith("check ")  # the table comes first
    assert "broken" not in captured.out
