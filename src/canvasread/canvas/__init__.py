"""The canvas method: labels, prompt and canvas planning, seeded noise, the `Reader` seam, readout, the backend."""
