"""Generation with transformers models: batched, left padded, KV cache.

Two paths, chosen by ``backend.options.decode``:

- ``generate`` (default): transformers' ``generate`` with its dynamic cache. Any causal LM.
- ``static``: :mod:`mlmt_bench.rollout.static_decode`, a static KV cache and a fixed-shape decode
  step that is captured as a CUDA graph on a GPU (Llama-family models: llama, qwen2, qwen3,
  mistral). Same ids and log-probs as ``generate`` on the CPU in float32 (tested), several times its
  speed on a GPU; under bfloat16 autocast on a CPU the two round differently (same first token, then
  they may part: SmolLM2 with LoRA, 8 greedy rows of 32 tokens, 4 identical).
  Stop strings are matched in the generated text only (as vLLM does); ``generate`` also stops on a
  stop string that begins in the prompt.

Options (``backend: {name: hf, options: {...}}``): ``batch_size`` (256: rows per forward),
``decode`` (generate | static), and for ``static``: ``graphs`` (auto: on for CUDA models),
``buckets`` (auto: as graphs; rows rounded to powers of two and cache lengths to 64, 96, 128, 192,
... so graphs are reused), ``max_cache_mb`` (KV-cache budget per model; auto: 4096 on CUDA, none
on the CPU), ``keep_cache`` (auto: as graphs; keep each model's KV caches between calls, else
free them at the end of every call), ``sync_every`` (decode steps between host checks for
finished rows; auto: 8 with graphs, else 1), ``sampler`` (auto | multinomial | race; auto: race
with graphs, else multinomial, which draws exactly what generate draws), ``compact`` (false; true:
without graphs, step only on the rows still generating once a quarter of the batch has finished:
fewer rows per step, but the smaller products may round differently, so ids can part from
generate's where two logits are that close, and a seed no longer gives generate's draws),
``merge_lora`` (false; true: each LoRA linear layer runs as one product with its weight merged,
``W + s·B·A`` of its active adapters, made again at every call; nothing is merged in place. Five
operations per layer become one, but ``x·(W + ΔW)`` rounds differently from ``x·W + s·(x·A)·B``,
so ids can part from generate's where two logits are that close), ``prefix_cache_mb`` (0: off; a
budget in MB: keep the keys and values of the prompts and generated tokens of a call marked
``keep`` (a rollout's attempts), so that prompts beginning with them (the refinements after
feedback and after g∅) compute only their new tokens, as vLLM's prefix caching does. Kept keys of generated
tokens are the decode steps', which round differently from a prefill's, so ids can part from
generate's where two logits are that close; not with ``compact``), ``share_prompts`` (true: rows of a call
with the same prompt, a group's samples of one problem, compute its prefill once and copy its keys,
values and first-token logits; generate's ids and log-probs in tests, the same ids as computing
every row on SmolLM2 with a LoRA (``perf/share_prompts_speed.py``); false: every row computed).

The vLLM backend stays the recommended engine for large models on GPUs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from mlmt_bench.errors import UserError
from mlmt_bench.rollout.backend import (
    Backend,
    BackendTraits,
    Generation,
    GenerationLoad,
    MemoryItem,
    forward_memory,
    reject_unknown_options,
    with_defaults,
)
from mlmt_bench.rollout.stops import StopStrings

if TYPE_CHECKING:  # torch loads when generating, not when a spec naming this backend is validated
    import torch

DECODE_MODES = ("generate", "static")

#: the static KV-cache budget per model (MB) of ``max_cache_mb: auto`` on CUDA (none on the CPU)
AUTO_MAX_CACHE_MB_CUDA = 4096


class HFBackend(Backend):
    """``generate(model, tokenizer, prompts, ...)`` for lists of already tokenised prompts.

    Prompts are token ids (token-in/token-out: nothing is re-tokenised here). They are left
    padded into one batch of at most ``batch_size`` rows per forward.

    Traits: generates with the training model object itself (no copy of the weights), so FSDP
    works (the parameters are gathered around generation).
    """

    name = "hf"
    traits = BackendTraits(holds_weights=False, supports_fsdp=True, keeps_prefixes=True)

    @classmethod
    def throughput_key(cls, options: dict[str, Any]) -> str:
        return "hf-static" if options.get("decode") == "static" else "hf-generate"

    @classmethod
    def generation_memory(cls, load: GenerationLoad, options: dict[str, Any]) -> list[MemoryItem]:
        """Rows of at most ``batch_size``; ``generate``'s KV cache lives while generating, the static
        decoder's (cache lengths on the ladder when bucketed, capped by ``max_cache_mb``) is kept
        between calls where ``keep_cache`` says so (with graphs), else it lives while generating;
        with ``merge_lora`` the decoder keeps a merged copy of the weights an adapter wraps, with
        ``prefix_cache_mb`` the keys and values of a call's sequences (at most the budget)."""
        o = with_defaults(cls, options)
        rows = min(int(o["batch_size"]), load.sequences)
        if o["decode"] == "static":
            from mlmt_bench.rollout.static_decode import _length_ladder

            graphs = _flag(o["graphs"], load.gpu)
            buckets = _flag(o["buckets"], graphs)
            cache_len = _length_ladder(int(math.ceil(load.length))) if buckets else math.ceil(load.length)
            budget = o["max_cache_mb"]
            budget = (AUTO_MAX_CACHE_MB_CUDA if load.gpu else None) if budget == "auto" else budget
            kv = rows * cache_len * load.kv_bytes
            if budget is not None:
                kv = min(kv, budget * 2 ** 20)
            cache = [("persistent", f"static KV cache ({load.role}, kept between calls)", kv)
                     if _flag(o["keep_cache"], graphs)
                     else ("generation", f"static KV cache ({load.role}, freed after each call)", kv)]
            if o["merge_lora"] and load.adapted:
                cache.append(("persistent", f"merged LoRA weights ({load.role}, merge_lora)",
                              load.adapted * load.dtype_bytes))
            if o["prefix_cache_mb"] and load.role == "solver":  # rollouts mark only the attempts call keep
                cache.append(("persistent", f"kept prefixes ({load.role}, prefix_cache_mb)",  # a call's rows
                              min(load.sequences * load.length * load.kv_bytes, o["prefix_cache_mb"] * 2 ** 20)))
        else:
            cache = [("generation", f"KV cache of generate ({load.role})", rows * load.length * load.kv_bytes)]
        return [*cache, *forward_memory(load, rows)]

    def __init__(self, batch_size: int = 256, decode: str = "generate", graphs: Any = "auto", buckets: Any = "auto",
                 max_cache_mb: Any = "auto", sync_every: Any = "auto", sampler: str = "auto",
                 keep_cache: Any = "auto", compact: Any = False, merge_lora: Any = False, prefix_cache_mb: Any = 0,
                 share_prompts: Any = True, **unknown: Any) -> None:
        reject_unknown_options(HFBackend, "hf", unknown)
        self.check_values(batch_size=batch_size, decode=decode, graphs=graphs, buckets=buckets,
                          max_cache_mb=max_cache_mb, sync_every=sync_every, sampler=sampler, keep_cache=keep_cache,
                          compact=compact, merge_lora=merge_lora, prefix_cache_mb=prefix_cache_mb,
                          share_prompts=share_prompts)
        self.batch_size = batch_size
        self.decode = decode
        self.static_options = dict(graphs=graphs, buckets=buckets, max_cache_mb=max_cache_mb, sync_every=sync_every,
                                   sampler=sampler, keep_cache=keep_cache, compact=compact, merge_lora=merge_lora,
                                   prefix_cache_mb=prefix_cache_mb, share_prompts=share_prompts)
        self.decoders: dict[int, Any] = {}  # id(model) -> StaticDecoder (which holds the model)

    # The ignore[override] below: the base takes **options, but options reach check_values only after
    # reject_unknown_options, so only this backend's own names (its constructor's) arrive
    @staticmethod
    def check_values(*, decode: str = "generate", graphs: Any = "auto", buckets: Any = "auto",  # type: ignore[override]
                     max_cache_mb: Any = "auto", sync_every: Any = "auto", sampler: str = "auto",
                     keep_cache: Any = "auto", compact: Any = False, merge_lora: Any = False,
                     prefix_cache_mb: Any = 0, share_prompts: Any = True, batch_size: Any = 256) -> None:
        """One-line errors for option values this backend cannot use (``mlmt-bench validate`` calls it)."""
        if not (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1):
            raise UserError(f"backend hf: options.batch_size must be an integer ≥ 1, got {batch_size!r}")
        if decode not in DECODE_MODES:
            raise UserError(f"backend hf: options.decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        for name, value in (("graphs", graphs), ("buckets", buckets), ("keep_cache", keep_cache)):
            if value not in ("auto", True, False):
                raise UserError(f"backend hf: options.{name} must be auto, true or false, got {value!r}")
        if sampler not in ("auto", "multinomial", "race"):
            raise UserError(f"backend hf: options.sampler must be auto, multinomial or race, got {sampler!r}")
        if max_cache_mb != "auto" and max_cache_mb is not None and not (isinstance(max_cache_mb, (int, float))
                                                                       and max_cache_mb > 0):
            raise UserError(f"backend hf: options.max_cache_mb must be auto, null or a positive number, "
                            f"got {max_cache_mb!r}")
        if sync_every != "auto" and not (isinstance(sync_every, int) and sync_every >= 1):
            raise UserError(f"backend hf: options.sync_every must be auto or an integer ≥ 1, got {sync_every!r}")
        if share_prompts not in (True, False):
            raise UserError(f"backend hf: options.share_prompts must be true or false, got {share_prompts!r}")
        for name, value in (("compact", compact), ("merge_lora", merge_lora)):
            if value not in (True, False):
                raise UserError(f"backend hf: options.{name} must be true or false, got {value!r}")
            if value and decode != "static":
                raise UserError(f"backend hf: options.{name} changes the static decoder; it needs decode: static "
                                f"(got decode: {decode})")
        mb = prefix_cache_mb
        if isinstance(mb, bool) or not (isinstance(mb, (int, float)) and mb >= 0):
            raise UserError(f"backend hf: options.prefix_cache_mb must be a number ≥ 0 (0: off), got {mb!r}")
        if prefix_cache_mb and decode != "static":
            raise UserError(f"backend hf: options.prefix_cache_mb keeps the static decoder's keys and values; it needs "
                            f"decode: static (got decode: {decode})")
        if prefix_cache_mb and compact:
            raise UserError("backend hf: options.prefix_cache_mb and compact cannot be combined (compacted rows leave "
                            "the state whose keys and values would be kept)")

    def sync_weights(self, model: Any) -> None:
        """Nothing to copy: generation uses the training model object itself. The static decoder's
        graphs read the parameters in place; it drops them if a parameter got new storage."""
        dec = self.decoders.get(id(model))
        if dec is not None:
            dec.check_params()

    def decoder(self, model: Any) -> Any:
        """The :class:`~mlmt_bench.rollout.static_decode.StaticDecoder` of ``model`` (made on first use)."""
        dec = self.decoders.get(id(model))
        if dec is None or dec.model is not model:
            from mlmt_bench.rollout.static_decode import StaticDecoder

            on_cuda = next(model.parameters()).device.type == "cuda"
            o = self.static_options
            graphs = _flag(o["graphs"], on_cuda)
            if graphs and not on_cuda:
                raise UserError("backend hf: options.graphs: true needs a CUDA model")
            buckets = _flag(o["buckets"], graphs)
            dec = StaticDecoder(
                model, graphs=graphs, buckets=buckets,
                max_cache_mb=(AUTO_MAX_CACHE_MB_CUDA if on_cuda else None) if o["max_cache_mb"] == "auto"
                else o["max_cache_mb"],
                sync_every=(8 if graphs else 1) if o["sync_every"] == "auto" else o["sync_every"],
                sampler=("race" if graphs else "multinomial") if o["sampler"] == "auto" else o["sampler"],
                max_rows=self.batch_size, keep_cache=_flag(o["keep_cache"], graphs), compact=o["compact"],
                merge_lora=o["merge_lora"], prefix_cache_mb=o["prefix_cache_mb"], share_prompts=o["share_prompts"])
            self.decoders[id(model)] = dec
        return dec

    def close(self) -> None:
        """Release the static decoders' KV caches and graphs (plain generate holds nothing)."""
        self.decoders.clear()

    def generate(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        keep: bool = False,
    ) -> list[Generation]:
        """``keep``: later prompts will extend these (``prefix_cache_mb`` keeps their keys and values)."""
        import torch

        from mlmt_bench.models.adapters import activate

        with torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            if not prompts:
                return []
            activate(model)  # a role of a shared base: its adapter is the one the decoder's modules apply
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            eos_id = tokenizer.eos_token_id
            stops = StopStrings(tokenizer, stop) if stop else None
            if self.decode == "static":
                min_new = int(getattr(getattr(model, "generation_config", None), "min_new_tokens", None) or 0)
                ids, logprobs = self.decoder(model).generate(
                    prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, eos_id=eos_id,
                    pad_id=pad_id, stops=stops, min_new_tokens=min_new, keep=keep)
                return _records(ids, logprobs, eos_id, pad_id, tokenizer, stops)
            out: list[Generation] = []
            for start in range(0, len(prompts), self.batch_size):
                ids, logprobs = self._generate_batch(model, tokenizer, prompts[start:start + self.batch_size],
                                                     max_new_tokens, temperature, top_p, stop, pad_id, eos_id)
                out.extend(_records(ids, logprobs, eos_id, pad_id, tokenizer, stops))
            return out

    def _generate_batch(self, model, tokenizer, prompts, max_new_tokens, temperature, top_p, stop, pad_id, eos_id):
        """transformers ``generate`` on one left-padded batch: new ids ``[n, T]`` and their log-probs."""
        import torch

        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        sampling = temperature > 0
        chosen = ChosenLogprobs()
        processors: list[Any] = []
        if sampling:  # the spec's warpers, then the recorder, which so sees the distribution sampled from
            from transformers import TemperatureLogitsWarper, TopPLogitsWarper

            processors += [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            do_sample=sampling,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            return_dict_in_generate=True,
            synced_gpus=False,  # every process generates alone (FSDP: on weights gathered by mlmt_bench/fsdp.py)
            logits_processor=[*processors, chosen],
            # the spec's temperature and top-p are the only warpers (above, as processors): none of the
            # model's generation_config (SmolLM2's, Qwen's) is added after them
            **_no_warpers(),
        )
        if stop:
            kwargs.update(stop_strings=stop, tokenizer=tokenizer)
        was_training = model.training
        model.eval()
        try:
            res = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        finally:
            model.train(was_training)
        new = res.sequences[:, width:].cpu()
        return new, chosen.finish(new)


def _flag(value: Any, auto: bool) -> bool:
    """An ``auto | true | false`` option: ``auto`` as given, else the value."""
    return auto if value == "auto" else bool(value)


class ChosenLogprobs:
    """A logits processor, last in ``generate``'s list, that keeps the log-prob of each sampled
    token under the distribution it was sampled from: ``[B]`` a step, where ``output_scores``
    keeps the whole ``[B, V]`` scores of every step until the end (SmolLM2: 256 rows x 49,152
    vocabulary x 4 bytes = 50 MB a step, 6.4 GB for 128 tokens).

    Called at step t with the ids so far (the token sampled at t-1 last) and the processed scores
    of step t: it gathers step t-1's log-prob and keeps step t's log-softmax, whose token
    :meth:`finish` reads from the generated ids."""

    def __init__(self) -> None:
        self.last: Any = None  # [B, V] log-softmax of the newest step
        self.steps: list[Any] = []  # [B] a step

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.last is not None:
            self.steps.append(self.last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.last = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new: Any) -> Any:
        """``[B, T]`` log-probs of the generated ids ``new`` ``[B, T]`` (T: the steps taken)."""
        import torch

        if self.last is None or new.shape[1] == 0:
            return torch.zeros((new.shape[0], 0))
        last = self.last.gather(1, new[:, len(self.steps):len(self.steps) + 1].to(self.last.device)).squeeze(1)
        out = torch.stack([*self.steps, last], dim=1).cpu()
        self.last, self.steps = None, []
        return out


def _no_warpers() -> dict[str, None]:
    """``generate`` kwargs that switch off every warper this transformers version knows."""
    from transformers import GenerationConfig

    names = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
    return {k: None for k in names if hasattr(GenerationConfig(), k)}


def _records(new: torch.Tensor, step_logprobs: torch.Tensor, eos_id: int | None, pad_id: int, tokenizer: Any,
             stops: StopStrings | None) -> list[Generation]:
    """One :class:`Generation` per padded row of new ids ``[n, T]`` and their log-probs ``[n, T]``."""
    gens = []
    for i in range(new.shape[0]):
        row = new[i].tolist()
        n, reason = _cut(row, eos_id, pad_id, stops)
        ids = row[:n]
        gens.append(Generation(
            ids=ids,
            logprobs=step_logprobs[i, :n].tolist(),
            finish_reason=reason,
            text=tokenizer.decode(ids, skip_special_tokens=True),
        ))
    return gens


def _cut(row: list[int], eos_id: int | None, pad_id: int,
         stops: StopStrings | None) -> tuple[int, Literal["stop", "length"]]:
    """Length of the real continuation in a padded row, and why it ended."""
    if eos_id is not None and eos_id in row:
        return row.index(eos_id) + 1, "stop"
    if stops is not None:
        # generate pads a row after a stop string; the row ends at the first one completed.
        n = stops.end(row)
        if n is not None:
            return n, "stop"
    n = len(row)
    while n > 0 and row[n - 1] == pad_id and pad_id != eos_id:
        n -= 1
    return n, "length"
