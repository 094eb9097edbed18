"""Benchmarks: fixed seeds, printed figures; apart from the product and from the tests."""
