"""The one vocabulary of the pipeline runtime: what stages produce, and what the coordinator and
the stage processes say to each other (plain tuples of strings and payloads: cheap to pickle).

A stage executor's ``step`` returns outputs ``(kind, rid, payload)``:
  (FINAL, rid, payload)     its final payload, along ``next`` edges
  (CHUNK, rid, data)        one chunk, along ``stream_to`` edges (``payloads.py``'s types)
  (END, rid, info)          the stream along ``stream_to`` edges is complete
  (OUT, rid, what)          client output (terminals), ``what`` one of
                            ("text", str[, logprobs]) | ("audio", int16 ndarray)
                            | ("clip", (language, start s, end s)): a transcription's next clip
                            | ("words", [(word, start s, end s), ...]): its word timestamps
  (DONE, rid, info)         this stage has finished the request
  (ERROR, rid, message)     the request failed in this stage
  (INVALID, rid, message)   the stage refused the request's content (the client's fault)

An edge between two stages of one process is handed over inside that process (see
``dispatch.py``); only what leaves the process travels below.

coordinator -> stage process (one multiprocessing queue per process; each put is a list of):
  (OPEN, rid, {stage: meta})             a request's active stages in this process
  (INPUT, stage, rid, src, payload)      a final payload for ``stage`` from ``src`` (a stage of
                                         another process, or ``graph.REQUEST_INPUT``)
  (CHUNK, stage, rid, src, data)         a stream chunk from ``src`` in another process
  (END, stage, rid, src, info)           the stream from ``src`` is complete
  (CLOSE, rid)                           the request is over (finished, failed or aborted):
                                         forget it in every stage of the process
  (STOP,)
stage process -> coordinator (one pipe per process; each send is a list of):
  (PROGRESS, text) | (READY, stage) | (FATAL, text)
  (LOAD, {stage: (depth, busy)}, {(src, dst): (handed over, serialised, bytes)}, peak bytes)
  (kind, stage, rid, payload)            an output above that must leave the process
Payload arrays above a small size travel through shared memory (see transport.py).
"""

from __future__ import annotations

from typing import Any

# stage outputs (FINAL/CHUNK/END also name the coordinator's forwarding of them)
FINAL = "final"
CHUNK = "chunk"
END = "end"
OUT = "out"
DONE = "done"
ERROR = "error"
INVALID = "invalid"

Output = tuple[str, str, Any]

# coordinator -> stage process
OPEN = "open"
INPUT = "input"
CLOSE = "close"
STOP = "stop"

# stage process -> coordinator
PROGRESS = "progress"
READY = "ready"
FATAL = "fatal"
LOAD = "load"

REQUEST_INPUT = "request"  # the pseudo-source of the entry stage's input
