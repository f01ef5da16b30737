"""One of SGLang's tensor-parallel ranks beyond the first, in a process of its own (started by
``engine.Ranks``): its engine over its shard, then rank 0's commands from its pipe until rank 0
closes it or is gone (end of file)."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from worker.engines.sglang.engine import SGLangEngine


def follow(fd: int) -> None:
    """One rank beyond the first: its engine, then rank 0's commands until it closes."""
    conn = Connection(fd, writable=False)
    engine = SGLangEngine(conn.recv())
    try:
        while True:
            try:
                op, *args = conn.recv()
            except EOFError:  # (rank 0 is gone)
                return
            if op == "close":
                return
            engine.follow(op, *args)
    finally:
        engine.close()


if __name__ == "__main__":
    follow(int(sys.argv[1]))
