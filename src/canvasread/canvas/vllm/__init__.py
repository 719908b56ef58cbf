"""The vLLM wing: the canvas method read through vLLM servers (pool, reader, backend factory)."""
