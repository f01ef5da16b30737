"""The OpenAI Realtime API on the worker (``/v1/realtime``, WebSocket): client events
(``events``), session settings (``config``), the input audio buffer and server VAD
(``input_audio``, ``turns``), the conversation (``conversation``, stored by
``fleet.conversations``), responses driving the engine (``response``), one session
(``session``) and the route (``endpoint``)."""
