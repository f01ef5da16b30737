"""Messages between the coordinator and stage processes (plain tuples: cheap to pickle).

coordinator -> host (one multiprocessing queue per process; each put is a list of):
  (START, stage, rid, meta, inputs)      all required inputs of ``stage`` arrived
  (CHUNK, stage, rid, src, data)         a stream chunk from ``src``
  (END, stage, rid, src, info)           the stream from ``src`` is complete
  (ABORT, rid)                           forget the request in every stage of the process
  (STOP,)
host -> coordinator (one pipe per process; each send is a list of):
  (PROGRESS, text) | (READY, stage) | (FATAL, text) | (LOAD, {stage: (depth, busy)})
  (kind, stage, rid, payload) with kind in worker.stages.base FINAL/CHUNK/END/OUT/DONE/ERROR
Payload arrays above a small size travel through shared memory (see transport.py).
"""

from __future__ import annotations

START = "start"
CHUNK = "chunk"
END = "end"
ABORT = "abort"
STOP = "stop"

PROGRESS = "progress"
READY = "ready"
FATAL = "fatal"
LOAD = "load"
