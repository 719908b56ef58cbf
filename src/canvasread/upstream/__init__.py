"""Reaching other inference servers over HTTP: the pool and the settings that every HTTP wing shares."""
