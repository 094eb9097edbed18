"""Subcommand modules of gpu-dra that belong to the testbed (see cli.main)."""
