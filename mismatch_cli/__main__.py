"""`python -m mismatch_cli` runs the CLI."""

from mismatch_cli.cli import entry

entry()
