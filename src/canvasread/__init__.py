"""canvasread: a self-hosted System One decision server."""

__version__ = "0.1.0"
