"""The contract between omni-router and omni-worker: Redis key layout, records, errors."""
