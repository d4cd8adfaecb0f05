"""A small least-recently-used cache."""
from collections import OrderedDict


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used key.

    get() of a present key and put() (insert or update) both count as
    a use of the key. `key in cache` and len(cache) do not.
    """

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        """Return the value for key (marking it used), or default."""
        if key not in self._data:
            return default
        return self._data[key]

    def put(self, key, value):
        """Insert or update key, evicting the LRU key if over capacity."""
        if key in self._data:
            self._data[key] = value
        else:
            self._data[key] = value
            if len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)
