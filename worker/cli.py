"""``omni-worker``: the node daemon. Flags are ``WorkerSettings`` fields (each also an
``OMNI_`` variable); spec overrides are ``--<stage>.<field> VALUE``, as in ``omni-plan``."""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError
from pydantic_settings import SettingsError

from fleet.cli_help import cli_source
from worker.settings import WorkerSettings


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--thinker.dtype fp32`` / ``--thinker.dtype=fp32`` -> ``thinker.dtype=fp32``; a dot in
    the flag name is what tells a spec override from a worker flag."""
    rest: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if "." in name:
            if "=" in arg:
                overrides.append(arg[2:])
            elif i + 1 < len(argv):
                overrides.append(f"{name}={argv[i + 1]}")
                i += 1
            else:
                raise SystemExit(f"omni-worker: {arg} needs a value")
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    try:
        settings = WorkerSettings(
            _cli_settings_source=cli_source(WorkerSettings, "omni-worker", args)
        )
    except (ValidationError, SettingsError) as exc:
        print(f"omni-worker: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    from worker.daemon import run  # heavy imports (torch via the planner) after --help

    return run(settings, overrides)


if __name__ == "__main__":
    sys.exit(main())
