"""One of SGLang's tensor-parallel ranks beyond the first, in a process of its own (started by
``engine.Ranks``): its engine over its shard, then rank 0's commands from its pipe until rank 0
closes it or is gone (end of file).

The rank's engine settings are rank 0's with the rank's own device: the process caps its
allocator with the plan's budget as rank 0's process does, and the engine calls the family's
``registers`` (the model classes SGLang builds) before SGLang builds the model, so that every
rank runs rank 0's class over its shard."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from worker.engines import gpu_memory
from worker.engines import sglang as vendor
from worker.engines.sglang.engine import EngineSettings, SGLangEngine, receive


def follow(fd: int) -> None:
    """One rank beyond the first: its engine, then rank 0's commands until it closes."""
    vendor.load()  # (before the settings arrive: their registers import SGLang's model classes)
    conn = Connection(fd, writable=False)
    settings: EngineSettings = receive(conn)
    if settings.budget is not None and settings.device.startswith("cuda"):
        gpu_memory.apply(settings.budget, settings.device)
    engine = SGLangEngine(settings)
    try:
        while True:
            try:
                op, *args = receive(conn)
            except EOFError:  # (rank 0 is gone)
                return
            if op == "close":
                return
            engine.follow(op, *args)
    finally:
        engine.close()


if __name__ == "__main__":
    follow(int(sys.argv[1]))
