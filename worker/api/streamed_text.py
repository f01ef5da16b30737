"""Text that arrives in pieces while it is spoken: the deltas of a speech stream
(``/v1/audio/speech/stream``) or of a realtime text-to-speech session
(``input_text_buffer.append``), read by the engine as they come
(``GenerationRequest.text_stream``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fleet.errors import ErrorCode, OmniError
from worker.api.schemas import SPEECH_INPUT_CHARS


class StreamedText:
    def __init__(self, first: str, param: str) -> None:
        self.first = first  # what the request starts with
        self.chars = 0
        self._count(first, param)
        self.done = False
        self._pieces: asyncio.Queue[str | None] = asyncio.Queue()

    def add(self, delta: str, param: str) -> None:
        """One more piece (400 naming ``param`` when it is one too many, the piece dropped)."""
        if self.done:
            raise OmniError(400, ErrorCode.INVALID_REQUEST, "the text was already complete", param)
        self._count(delta, param)
        self._pieces.put_nowait(delta)

    def _count(self, piece: str, param: str) -> None:
        """An utterance's whole text is at most SPEECH_INPUT_CHARS, as one speech request's."""
        if self.chars + len(piece) > SPEECH_INPUT_CHARS:
            raise OmniError(
                400, ErrorCode.INVALID_REQUEST,
                f"an utterance's text is at most {SPEECH_INPUT_CHARS} characters", param,
            )  # fmt: skip
        self.chars += len(piece)

    def end(self) -> None:
        if not self.done:
            self.done = True
            self._pieces.put_nowait(None)

    async def pieces(self) -> AsyncIterator[str]:
        """The pieces after the first, until the end."""
        while (piece := await self._pieces.get()) is not None:
            yield piece
