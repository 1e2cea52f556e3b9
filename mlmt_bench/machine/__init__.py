"""The machine a run runs on: the CPUs a process may use (:mod:`mlmt_bench.machine.cpus`), the CPU pin
that makes floats the same on machines of one vendor (:mod:`mlmt_bench.machine.reproducible`),
environment variables for a block (:mod:`mlmt_bench.machine.environ`), data parallelism under
``accelerate launch`` (:mod:`mlmt_bench.machine.dist`), Ray as the executor of experiments and sweeps
(:mod:`mlmt_bench.machine.cluster`) and the peak memory of each phase of a step
(:mod:`mlmt_bench.machine.memory`).

Foundation floor (docs/architecture.md): nothing here imports from a floor above it.
"""
