"""The warm-start stage, before any RL: supervised fine-tuning (:mod:`~mlmt_bench.warmstart.sft`)
and the shared base every policy of every arm starts from (:mod:`~mlmt_bench.warmstart.shared_base`)."""
