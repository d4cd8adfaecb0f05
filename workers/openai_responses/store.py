"""The conversations of one rollout's Responses, for ``previous_response_id``: kept by the
boundary (one per rollout), bounded by count and by size."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# What one rollout keeps for previous_response_id: the conversations of its latest responses,
# by count and by their JSON's total size; an older one is forgotten (and then refused).
MAX_STORED_RESPONSES = 256
MAX_STORED_CHARS = 32 * 1024 * 1024


@dataclass
class ResponseStore:
    """The conversations of one rollout's responses, for ``previous_response_id``."""

    max_responses: int = MAX_STORED_RESPONSES
    max_chars: int = MAX_STORED_CHARS
    _kept: OrderedDict[str, tuple[list[dict[str, Any]], int]] = field(default_factory=OrderedDict)
    _chars: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            kept = self._kept.get(response_id)
            return None if kept is None else kept[0]

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        size = len(json.dumps(conversation))
        with self._lock:
            if size > self.max_chars:
                return  # larger than all there is room for: not kept (refused if named)
            self._kept[response_id] = (conversation, size)
            self._chars += size
            while len(self._kept) > self.max_responses or self._chars > self.max_chars:
                _, (_, dropped) = self._kept.popitem(last=False)
                self._chars -= dropped
