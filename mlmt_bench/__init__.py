"""mlmt-bench: a benchmark and ablation suite for RL of LLM reasoning with textual feedback.

Importing this package is cheap: heavy dependencies (torch, transformers, vllm, optuna,
lm-eval) are imported only by the modules that need them, when they are first used.
"""

__version__ = "0.1.0"
