"""The systemone wing: questions answered by another `/v1/systemone` server (vLLM, SGLang, a Jev API), read back
as distributions so calibration, rotation, abstention, stages and streaming work on top (settings, peers, split,
backend)."""
