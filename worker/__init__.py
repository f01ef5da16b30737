"""omni-worker: node daemon, pipeline runtime, stages, OpenAI-compatible API."""
