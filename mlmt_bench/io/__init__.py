"""What the package reads and writes, and what it tells the user: bounded reading of what a user
hands in (:mod:`mlmt_bench.io.bounded_input`), JSON Lines (:mod:`mlmt_bench.io.jsonl`), a
checkpoint's trainer state without pickle (:mod:`mlmt_bench.io.checkpoint_state`), notes and
warnings on stderr (:mod:`mlmt_bench.io.notes`) and progress bars (:mod:`mlmt_bench.io.progress`).

Foundation floor (docs/architecture.md): nothing here imports from a floor above it.
"""
