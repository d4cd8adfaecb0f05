"""The embedded default's filesystem broker: kombu's filesystem transport without its races.

kombu's own transport creates a message file and then writes it, in place. A worker polling the
queue in between renames the empty file away, reads nothing and dies on the JSON error (an
unrecoverable error for a Celery worker). It also moves a taken message to the system's
temporary directory, which is a copy and a delete when that is another filesystem, so two
workers can both take it. Here a message appears under its queue name only once it is whole
(written aside, then renamed into the queue folder), and a worker takes it with one rename
into the processed folder, which succeeds for exactly one worker. Messages are stamped in
microseconds rather than milliseconds, so one process's messages keep their order. Exchange
tables are created whole too. The rest (the name's form, the folders) is kombu's.

Settings select it (``CELERY_BROKER_TRANSPORT``) when ``CELERY_BROKER_URL`` is
``filesystem://``. The queue, processed and control folders must be on one filesystem.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

# A name _get, _size and _purge never match: kombu's readers take "<stamp>.<queue>.msg" only.
_PARTIAL_SUFFIX = ".partial"


def _write_aside(folder: str | Path, data: bytes) -> str:
    """Write data to a new file in folder, under a name no reader takes; return its path."""
    path = os.path.join(folder, f".{uuid.uuid4().hex}{_PARTIAL_SUFFIX}")
    # 0600 whatever the umask: a message names the work it asks for, for coevo's user only.
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb", buffering=0) as f:
        f.write(data)
    return path


class Channel(filesystem.Channel):
    """A filesystem channel whose messages are whole when seen and taken by one worker."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu stamps milliseconds, so messages put within one came out in random order.
        name = f"{monotonic_ns() // 1000:020d}_{uuid.uuid4()}.{queue}.msg"
        data = str_to_bytes(dumps(payload))
        partial = None
        try:
            partial = _write_aside(self.data_folder_out, data)
            os.replace(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            if partial is not None:
                _remove_quietly(partial)
            raise ChannelError(f"Cannot add message {name!r} to the queue folder") from exc

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                # One rename: exactly one worker takes the message; the rest see it gone.
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ChannelError(f"Cannot take message {name!r} from the queue") from exc
            try:
                with open(taken, "rb") as f:
                    payload = f.read()
                if not self.store_processed:
                    os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read message {name!r}") from exc
            return loads(bytes_to_str(payload))
        raise virtual.Empty()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # kombu creates a new table file empty and then locks and writes it, so a reader of
        # the table (a fanout publish) can find it empty. Create it whole; kombu's own code,
        # under its lock, then adds the binding to a table that exists.
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        if not file.exists():
            partial = None
            try:
                partial = _write_aside(self.control_folder, str_to_bytes(dumps([])))
                os.link(partial, file)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ChannelError(f"Cannot create {file}") from exc
            finally:
                if partial is not None:
                    _remove_quietly(partial)
        super()._queue_bind(exchange, routing_key, pattern, queue)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`."""

    Channel = Channel
