"""``--model-dir``: where a spec's weights and configs come from, given by the user.

A local directory (a Hugging Face download, or a tiny checkpoint) is used as it is. Anything
else of the form ``org/name`` is a Hugging Face repo id, resolved through the local Hugging Face
cache: offline it works from the cache alone, and nothing is downloaded unless the caller
allows it.
"""

from __future__ import annotations

from pathlib import Path

from planner.errors import SpecError


def resolve_model_dir(value: str, allow_download: bool = False) -> Path:
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"--model-dir {value}: the directory has no config.json")
        return path.resolve()
    if value.count("/") != 1 or value.startswith((".", "/", "~")):
        raise SpecError(f"--model-dir {value}: no such directory (nor a Hugging Face repo id)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        found = snapshot_download(value, local_files_only=not allow_download)
    except LocalEntryNotFoundError:
        raise SpecError(
            f"--model-dir {value}: not in the local Hugging Face cache; download it first "
            "(huggingface-cli download " + value + ") or allow downloads "
            "(omni-worker --allow-download)"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise SpecError(f"--model-dir {value}: {exc}") from None
    return Path(found)
