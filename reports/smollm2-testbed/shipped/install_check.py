"""Install the shipped warm start of a spec into an empty cache ($MLMT_BENCH_CACHE) and print its key,
sha256 and the seconds it took (the install checks the merged weights against the recorded sha256)."""
import sys
import time

from mlmt_bench import registry, spec as specs
from mlmt_bench.runner import templates_for
from mlmt_bench.warmstart.pretrained_base import WarmStartConfig, ensure_warm_start

spec = specs.load_any(sys.argv[1], [])
bench = registry.benchmarks.get(spec.benchmark.name)(**spec.benchmark.options)
cfg = WarmStartConfig.model_validate(spec.warm_start)
t0 = time.perf_counter()
ws = ensure_warm_start(cfg, templates_for(spec, bench), spec.benchmark.name, dict(spec.benchmark.options))
print(ws.record["key"], ws.record["sha256"], ws.directory, f"{time.perf_counter() - t0:.1f} s")
