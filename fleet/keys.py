"""Redis key layout of one fleet. Every key lives under a versioned prefix."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class FleetKeys:
    """Key names for the fleet called ``fleet``: ``omni:v1:{<fleet>}:...``.

    The braces are a Redis Cluster hash tag: every key of one fleet hashes to the same slot, so
    the multi-key transactions and Lua scripts of ``fleet.store`` stay legal on a cluster (a
    fleet's state is small; one slot holds it). Outside Cluster the braces mean nothing."""

    fleet: str = "default"

    @property
    def prefix(self) -> str:
        return f"omni:{SCHEMA_VERSION}:{{{self.fleet}}}:"

    @property
    def workers(self) -> str:
        """Set of every worker id that registered and has not deregistered."""
        return self.prefix + "workers"

    def worker(self, worker_id: str) -> str:
        """JSON ``WorkerRecord``; expires with the heartbeat TTL."""
        return f"{self.prefix}worker:{worker_id}"

    def load(self, worker_id: str) -> str:
        """JSON ``LoadReport``; expires with the heartbeat TTL."""
        return f"{self.prefix}load:{worker_id}"

    def plan(self, digest: str) -> str:
        """A launch plan's JSON, stored once per digest (identical workers share it) and kept
        out of the worker record, which every router reads every resync."""
        return f"{self.prefix}plan:{digest}"

    def affinity(self, session_key: str) -> str:
        """Session key -> worker id, with a sliding TTL."""
        return f"{self.prefix}affinity:{session_key}"

    @property
    def voices(self) -> str:
        """Hash: voice name -> JSON ``VoiceRecord`` (metadata)."""
        return self.prefix + "voices"

    def voice_audio(self, name: str) -> str:
        """Reference audio bytes of one uploaded voice (see ``VoiceRecord.format``)."""
        return f"{self.prefix}voice-audio:{name}"

    @property
    def voice_bytes(self) -> str:
        """Counter: bytes of voice audio stored in the fleet (the fleet quota's usage)."""
        return self.prefix + "stats:voice-bytes"

    @property
    def voice_bytes_by_owner(self) -> str:
        """Hash: API key id -> bytes of voice audio it stored (the per-key quota's usage)."""
        return self.prefix + "stats:voice-bytes-by-owner"

    @property
    def consents(self) -> str:
        """Hash: consent id -> JSON ``ConsentRecord``."""
        return self.prefix + "voice-consents"

    def consent_audio(self, consent_id: str) -> str:
        """The recording of one voice consent (PCM16 at 24 kHz)."""
        return f"{self.prefix}voice-consent-audio:{consent_id}"

    def reply_transcript(self, audio_id: str) -> str:
        """The transcript of a chat reply's audio, by its ``message.audio.id``: a later turn
        that names that id (``messages[].audio``) reads it on whichever worker it lands;
        expires with the audio (its ``expires_at``)."""
        return f"{self.prefix}reply-transcript:{audio_id}"

    @property
    def events(self) -> str:
        """Pub/sub channel of ``FleetEvent`` JSON: joins, readiness, drains, departures."""
        return self.prefix + "events"

    @property
    def loads(self) -> str:
        """Pub/sub channel of ``LoadReport`` JSON, published at every load report."""
        return self.prefix + "loads"

    @property
    def scale(self) -> str:
        """Hash: model -> ``ScaleSignal`` JSON, rewritten by every router each second; it
        expires when no router is left to rewrite it."""
        return self.prefix + "scale"

    @property
    def affinity_moves(self) -> str:
        """Counter of session bindings moved to another worker (bounded load, departures)."""
        return self.prefix + "stats:affinity-moves"

    def conversation(self, session_key: str) -> str:
        """List of a realtime session's conversation items (JSON), oldest first; bounded and
        expiring (``fleet.conversations``)."""
        return f"{self.prefix}conversation:{session_key}"

    def conversation_config(self, session_key: str) -> str:
        """A realtime session's settings (JSON: voice, instructions, ...), beside its items."""
        return f"{self.prefix}conversation-config:{session_key}"

    def conversation_pending(self, session_key: str) -> str:
        """A realtime session's response in flight (JSON: its ids and ``response.create``
        fields), set while it runs: a session resumed elsewhere re-runs it."""
        return f"{self.prefix}conversation-pending:{session_key}"

    def stored_response(self, name: str) -> str:
        """A stored Responses API response (JSON: the response, its input items and the
        conversation before it; ``fleet.responses``), named by its id under its API key's id."""
        return f"{self.prefix}response:{name}"
