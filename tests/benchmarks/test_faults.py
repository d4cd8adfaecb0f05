"""benchmarks/faults.py: its arguments and its table, from synthetic rows (no run: the real run,
real processes and minutes of faults, is the benchmark)."""

from __future__ import annotations

import pytest

from benchmarks import faults


def test_it_runs_every_fault_by_default():
    args = faults.parse_args([])
    assert args.faults == list(faults.FAULTS) and args.tasks == 24 and args.run_one is None


def test_it_takes_a_list_of_faults_and_a_task_count():
    args = faults.parse_args(["--faults", "kill9, redis-aof", "--tasks", "12"])
    assert args.faults == ["kill9", "redis-aof"] and args.tasks == 12


@pytest.mark.parametrize(
    "argv", [["--faults", "kill9,reboot"], ["--faults", ","], ["--tasks", "2"]]
)
def test_it_refuses_an_unknown_fault_or_too_few_tasks(argv, capsys):
    with pytest.raises(SystemExit):
        faults.parse_args(argv)
    assert "error" in capsys.readouterr().err


def row(fault, *, wall, end, finished=True, lost=0):
    return {"fault": fault, "wall_s": wall, "fault_end_s": end,
            "recovery_s": round(wall - end, 1) if finished else None, "finished": finished,
            "lost": lost, "scored_twice": 0, "manual_actions": 0, "api_500": 0, "api_503": 3,
            "policy_calls": 24}  # fmt: skip


def test_it_measures_recovery_beyond_what_the_baseline_needed_from_the_same_point():
    rows = faults.with_baseline(
        [row("none", wall=20.0, end=8.0), row("redis-aof", wall=45.0, end=30.0)]
    )
    # The baseline was done 20 s in, before the fault ended (30 s): all 15 s are beyond it.
    assert rows[1]["beyond_baseline_s"] == 15.0
    rows = faults.with_baseline([row("none", wall=20.0, end=8.0), row("kill9", wall=26.0, end=8.0)])
    assert rows[1]["beyond_baseline_s"] == 6.0  # 18 s after the kill, against the baseline's 12
    assert rows[0]["beyond_baseline_s"] is None


def test_it_prints_a_markdown_table_with_a_row_per_run():
    rows = faults.with_baseline(
        [
            row("none", wall=20.0, end=8.0),
            row("postgres", wall=400.0, end=30.0, finished=False, lost=3),
        ]
    )
    table = faults.format_table(rows).splitlines()
    assert table[0].startswith("| fault | wall s |") and table[1] == "|" + "---|" * len(
        faults.COLUMNS
    )
    assert table[2] == "| none | 20.0 | 8.0 | 12.0 | – | yes | 0 | 0 | 0 | 0 | 3 | 24 |"
    assert table[3] == "| postgres | 400.0 | 30.0 | – | – | **no** | 3 | 0 | 0 | 0 | 3 | 24 |"
