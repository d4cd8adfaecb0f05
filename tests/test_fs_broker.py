"""The embedded default's filesystem broker (coevo/fs_broker.py): whole messages, taken once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from coevo import fs_broker

TRANSPORT = "coevo.fs_broker:Transport"


def _options(root: Path) -> dict[str, object]:
    for sub in ("queue", "processed", "control"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(root / "queue"),
        "data_folder_out": str(root / "queue"),
        "processed_folder": str(root / "processed"),
        "control_folder": str(root / "control"),
        "store_processed": False,
    }


def _connection(root: Path, transport: str = TRANSPORT) -> Connection:
    return Connection("filesystem://", transport=transport, transport_options=_options(root))


def test_messages_round_trip_in_order_and_leave_nothing_behind(tmp_path: Path) -> None:
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs")
        for n in range(3):
            queue.put({"n": n})
        got = []
        for _ in range(3):
            message = queue.get(timeout=2)
            got.append(message.payload["n"])
            message.ack()
        assert got == [0, 1, 2]
        with pytest.raises(Empty):
            queue.get(timeout=0.1)
        queue.close()
    assert list((tmp_path / "queue").iterdir()) == []
    assert list((tmp_path / "processed").iterdir()) == []


def test_a_message_being_written_is_invisible_to_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race that killed the demo's worker: kombu's _put creates the message file under its
    # queue name and writes it afterwards, so a reader in between read an empty file.
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        seen_while_writing: list[object] = []
        write_aside = fs_broker._write_aside

        def write_then_look(folder, data):
            path = write_aside(folder, data)
            try:
                seen_while_writing.append(channel._get("jobs"))
            except Empty:
                seen_while_writing.append("empty")
            return path

        monkeypatch.setattr(fs_broker, "_write_aside", write_then_look)
        channel._put("jobs", {"body": "x" * 10_000})
        monkeypatch.undo()

        assert seen_while_writing == ["empty"]
        assert channel._get("jobs") == {"body": "x" * 10_000}
        assert channel._size("jobs") == 0


def test_concurrent_writers_and_readers_deliver_each_message_exactly_once(tmp_path: Path) -> None:
    total, writers, readers = 400, 2, 3
    body = "y" * 50_000  # large enough that a write is not one instant
    received: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    done_writing = threading.Event()

    def write(start: int) -> None:
        with _connection(tmp_path) as conn:
            channel = conn.channel()
            for n in range(start, total, writers):
                channel._put("jobs", {"n": n, "body": body})

    def read() -> None:
        with _connection(tmp_path) as conn:
            channel = conn.channel()
            while True:
                try:
                    payload = channel._get("jobs")
                except Empty:
                    if done_writing.is_set() and channel._size("jobs") == 0:
                        return
                    continue
                except BaseException as exc:  # the failure under test: record it, stop
                    errors.append(exc)
                    return
                assert payload["body"] == body
                with lock:
                    received.append(payload["n"])

    reader_threads = [threading.Thread(target=read) for _ in range(readers)]
    writer_threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in reader_threads + writer_threads:
        thread.start()
    for thread in writer_threads:
        thread.join(timeout=60)
    done_writing.set()
    for thread in reader_threads:
        thread.join(timeout=60)

    assert errors == []
    assert sorted(received) == list(range(total))
    assert [p.name for p in (tmp_path / "queue").iterdir()] == []


def test_exchange_tables_are_created_whole(tmp_path: Path) -> None:
    with _connection(tmp_path) as conn:
        channel = conn.channel()
        channel._queue_bind("broadcast", "", "", "a")
        channel._queue_bind("broadcast", "", "", "b")
        assert sorted(q.queue for q in channel.get_table("broadcast")) == ["a", "b"]
        channel._put_fanout("broadcast", {"hello": 1}, "")
        assert channel._get("a") == {"hello": 1}
        assert channel._get("b") == {"hello": 1}
    assert [p.name for p in (tmp_path / "control").iterdir()] == ["broadcast.exchange"]


def test_settings_select_it_for_the_filesystem_broker(tmp_path: Path) -> None:
    # Tests run on Redis, so the embedded default's settings load in a fresh interpreter.
    code = (
        "import django; django.setup(); from coevo.celery import app;"
        "print(type(app.connection_for_write().transport).__module__)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "DATABASE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="coevo.settings", COEVO_HOME=str(tmp_path / "home"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "coevo.fs_broker"
