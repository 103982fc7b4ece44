"""Hosted engines: a model behind an HTTP API (Inception's Mercury Edit and Mercury FIM, an
OpenAI-compatible /v1/completions server, llama.cpp's /infill, Ollama) behind the Engine protocol.

`settings` is what the user configures (and what is refused), `prompts` every request body and
answer of every kind in one place, `http_engine` the engine. Importing this package imports no
HTTP client: httpx is imported when an engine is made (docs/engines.md).
"""
