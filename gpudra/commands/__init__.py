"""One module per `gpu-dra` subcommand; each exposes `register(parser)` and `run(args) -> int`."""
