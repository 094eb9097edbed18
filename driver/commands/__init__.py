"""Subcommand modules of gpu-dra (see cli.main)."""
