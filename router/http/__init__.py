"""The router's data path: raw asyncio protocols, httptools parsing, keep-alive pools."""
