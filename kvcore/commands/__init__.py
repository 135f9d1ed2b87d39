"""Subcommands of the `kvcore` command line (see kvcore.cli)."""
