"""Verifiers: judge a response to a problem and return a :class:`mlmt_bench.types.Verdict`."""
