"""The engines under the autoregressive stages.

A stage executor (``worker/stages/``, ``worker/models/<family>/``) owns its stage's protocol:
what it takes from upstream stages, what it streams on. An engine owns the serving part under
it: the KV pool, the scheduling of prefill and decode steps, prefix reuse, sampling and
constrained decoding. ``base`` is the interface the executors use; ``sglang`` is SGLang's
scheduler behind it (every patch of SGLang lives there).
"""
