"""The in-process engine: the only torch code; a `Reader` that runs DiffusionGemma reads on this machine."""
