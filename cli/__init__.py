"""The `gpu-dra` program: the one package that knows every side (product, testbed, benchmarks) and wires them."""
