"""Subcommand modules of gpu-dra (see gpudra.cli)."""
