"""The OpenAI Realtime API on the worker (``/v1/realtime``, WebSocket): client events
(``events``), session settings (``config``), the wire's audio formats (``g711``), the input
audio buffer and server VAD (``input_audio``, ``turns``), the conversation (``conversation``,
stored by ``fleet.conversations``), responses driving the engine (``planning``, ``response``),
input audio transcription (``transcripts``), one session (``session``), the beta protocol's
names (``dialect``), counters (``metrics``) and the route (``endpoint``)."""
