"""One stage process as seen from the coordinator: spawn, send, receive, notice death."""

from __future__ import annotations

import contextlib
import ctypes.util
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import wait

from worker.runtime.host import HostConfig, host_main
from worker.stages import messages as m

# Stage processes fork from a server that has imported torch and transformers once
# (worker/runtime/preload.py); "spawn" would import them again in every process.
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["worker.runtime.preload"])


def _start_forkserver() -> None:
    """The fork server, started (once) with jemalloc as the allocator of every stage process
    where it is installed (Debian's ``libjemalloc2``: ``scripts/install.sh``). A decode step
    allocates a few hundred small tensors; glibc's ``posix_memalign`` made the tiny thinker's
    step 13 % slower in process (2.10 against 1.83 ms at one request, 2.68 against 2.42 ms at
    eight: bench/bench_engines.py's notes in docs/omni-worker.md). The worker's own process
    keeps the system allocator: the variable is set only while the server is started."""
    jemalloc = ctypes.util.find_library("jemalloc")
    if jemalloc is None:
        forkserver.ensure_running()
        return
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = jemalloc if not before else f"{before}:{jemalloc}"
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = before


class StageProcess:
    """Spawns ``host_main`` and pumps its messages into ``on_messages`` from a reader thread;
    ``on_exit(exitcode)`` is called once when the process is gone (and its pipe drained)."""

    def __init__(
        self,
        cfg: HostConfig,
        on_messages: Callable[[list[tuple]], None],
        on_exit: Callable[[int | None], None],
    ) -> None:
        self.cfg = cfg
        self.name = cfg.process
        self.stages = list(cfg.stages)
        self.ready: set[str] = set()
        self._pending: list[tuple] = []
        _start_forkserver()
        self.inbox = _CTX.Queue()
        self._recv, send = _CTX.Pipe(duplex=False)
        self.proc = _CTX.Process(
            target=host_main, args=(cfg, self.inbox, send), name=f"omni-stage:{cfg.process}"
        )
        self.proc.daemon = True
        self.proc.start()
        send.close()  # the child holds the only write end: EOF on our side means it is gone
        self._on_messages, self._on_exit = on_messages, on_exit
        self._thread = threading.Thread(target=self._read, name=f"reader:{self.name}", daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def all_ready(self) -> bool:
        return self.ready >= set(self.stages)

    def send(self, msg: tuple) -> None:
        """Queue one message; it goes out with the next ``flush`` (one pickle + write for all)."""
        self._pending.append(msg)

    def flush(self) -> None:
        if not self._pending:
            return
        msgs, self._pending = self._pending, []
        with contextlib.suppress(ValueError, OSError):  # closed after the process died
            self.inbox.put(msgs)

    def _read(self) -> None:
        while True:
            ready = wait([self._recv, self.proc.sentinel])
            if self._recv in ready:
                try:
                    msgs = self._recv.recv()
                except (EOFError, OSError):
                    break
                self._on_messages(msgs)
            elif self.proc.sentinel in ready:
                # drain what the process sent before it died, then report
                while self._recv.poll():
                    try:
                        self._on_messages(self._recv.recv())
                    except (EOFError, OSError):
                        break
                break
        self.proc.join(timeout=5)
        self._on_exit(self.proc.exitcode)

    def stop(self, timeout: float = 5.0) -> None:
        self.send((m.STOP,))
        self.flush()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)
        self.close()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()

    def close(self) -> None:
        self.inbox.cancel_join_thread()
        self.inbox.close()
