"""When the API server's garbage collector may pause it.

A full (generation 2) collection walks every tracked object, so with thousands of requests in flight
each one pauses the event loop for a long time (every client, /health included; docs/benchmarks.md
has the pauses), and Python runs one every few seconds. Nearly all of the server's garbage is freed by reference
counting; full collections only matter for cycles, which can wait for a quiet moment:

- everything loaded at start-up is frozen (`gc.freeze`), so no collection walks it again;
- automatic collections stop at generation 1 (cheap: young objects only);
- `FullCollections.tick()`, called every second, runs a full collection when no request is in flight,
  or at the latest every `max_interval` seconds, so memory held by cycles stays bounded under any load.
"""

from __future__ import annotations

import gc
import time

# Generation 2 never starts by itself: the number of generation-1 collections it would wait for.
_NEVER = 2**31 - 1


class FullCollections:
    def __init__(self, idle_interval: float = 10.0, max_interval: float = 120.0) -> None:
        self.idle_interval = idle_interval
        self.max_interval = max_interval
        self.last = time.monotonic()

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        gen0, gen1, _ = gc.get_threshold()
        gc.set_threshold(gen0, gen1, _NEVER)

    def tick(self, busy: bool) -> bool:
        """Run a full collection if one is due; return whether it ran."""
        since = time.monotonic() - self.last
        if since < (self.max_interval if busy else self.idle_interval):
            return False
        gc.collect()
        self.last = time.monotonic()
        return True
