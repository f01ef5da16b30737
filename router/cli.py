"""``omni-router``: parse settings, then serve in this process or supervise ``--processes N``
children that share the port through SO_REUSEPORT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

from pydantic import ValidationError
from pydantic_settings import CliApp

from fleet.cli_help import cli_source
from router.loop import loop_factory
from router.settings import RouterSettings

_CHILD_ENV = "OMNI_ROUTER_CHILD"


def serve(settings: RouterSettings) -> None:
    from router.app import Router

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(Router(settings).serve())


def supervise(settings: RouterSettings, argv: list[str]) -> int:
    """Start N children with the same arguments; restart one that dies; stop all on a signal."""
    log = logging.getLogger("omni.router")
    env = dict(os.environ, **{_CHILD_ENV: "1"})
    cmd = [sys.executable, "-m", "router.cli", *argv]
    children: list[subprocess.Popen] = [
        subprocess.Popen(cmd, env=env) for _ in range(settings.processes)
    ]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        time.sleep(0.2)
        for i, child in enumerate(children):
            if child.poll() is not None and not stopping:
                log.warning(
                    "router process %d exited with %s; restarting", child.pid, child.returncode
                )
                time.sleep(0.5)
                children[i] = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + settings.shutdown_grace_s + 5
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings = CliApp.run(
            RouterSettings,
            cli_args=argv,  # else CliApp.run parses sys.argv whatever the source was given
            cli_settings_source=cli_source(RouterSettings, "omni-router", argv),
        )
    except ValidationError as exc:
        print(f"omni-router: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    if settings.local_workers:
        from router.local_fleet import run as run_local_fleet

        return run_local_fleet(settings)
    if settings.processes > 1 and not os.environ.get(_CHILD_ENV):
        return supervise(settings, argv)
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
