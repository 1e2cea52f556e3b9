"""Benchmarks: each yields :class:`mlmt_bench.types.Problem` records for a split."""
