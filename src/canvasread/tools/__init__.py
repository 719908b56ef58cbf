"""Tools that drive canvasread from outside: benchmark sweeps, load generation, test checkpoints."""
