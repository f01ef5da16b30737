"""What a listener hears of a streamed reply: a player that starts at the first chunk and plays
in real time. The worker's own underrun counter (worker/service.py, ``Ticket.audio``) uses the
same rule, so the benchmark's share and the ``omni_worker_audio_underruns_total`` series agree
when the network adds nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleet.records import UNDERRUN_SLACK_S

# The first chunk with a sample this loud (dBFS) is the first a listener hears; leading silence
# (a vocoder's warm-up, a stream's empty WAV header) does not count.
AUDIBLE_DBFS = -60.0
_AUDIBLE = 32768 * 10 ** (AUDIBLE_DBFS / 20)


def audible(pcm16: bytes) -> bool:
    """Whether little-endian 16-bit PCM holds a sample above the audible floor."""
    samples = np.frombuffer(pcm16[: len(pcm16) - len(pcm16) % 2], dtype="<i2")
    return bool(samples.size) and int(np.abs(samples.astype(np.int32)).max()) >= _AUDIBLE


@dataclass(frozen=True)
class Playback:
    """One reply as played: the times its player ran dry, for how long in all."""

    audio_s: float
    underruns: int
    stall_s: float

    @property
    def underran(self) -> bool:
        return self.underruns > 0


def play(chunks: list[tuple[float, float]], slack_s: float = UNDERRUN_SLACK_S) -> Playback:
    """Play ``chunks`` of ``(arrival second, audio seconds)``, in order of arrival.

    The player starts with the first chunk. A later chunk that arrives after everything before
    it has played out (plus ``slack_s``) is an underrun: the player stalls until it arrives, and
    plays on from there, so one slow step counts once, not once per chunk after it.
    """
    runs_dry_at: float | None = None  # when the audio received so far will have played out
    underruns, stall_s, total = 0, 0.0, 0.0
    for arrived, seconds in chunks:
        if runs_dry_at is None:
            runs_dry_at = arrived
        elif arrived > runs_dry_at + slack_s:
            underruns += 1
            stall_s += arrived - runs_dry_at
            runs_dry_at = arrived
        runs_dry_at += seconds
        total += seconds
    return Playback(audio_s=total, underruns=underruns, stall_s=stall_s)
