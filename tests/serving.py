"""The old name of `helpers`, kept while branches written before the rename land; import from `helpers`."""

from helpers import CliServer, cli_process, free_port, serve_app, serve_cli, wait_until

__all__ = ["CliServer", "cli_process", "free_port", "serve_app", "serve_cli", "wait_until"]
