"""The worker's OpenAI-compatible HTTP API (FastAPI on uvicorn)."""
