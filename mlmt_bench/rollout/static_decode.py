"""Generation with a static KV cache and a fixed-shape decode step, captured as CUDA graphs on a GPU.

This is the ``hf`` backend's ``decode: static`` path (``backend: {name: hf, options: {decode:
static}}``). Plain ``generate`` with a dynamic cache spends, for every generated token, Python time
in the generation loop (logits processors, stopping criteria, cache concatenation) and one kernel
launch per operation; on a GPU that, not arithmetic, sets its speed (issue 14: 9.1k tokens/s for a
308M model on an H200). Here:

- the KV cache is preallocated per *state*, a (rows, cache length) bucket:
  ``[rows, kv_heads, length, head_dim]`` per layer, reused from call to call;
- the prompts are prefilled eagerly, rows of similar length together, each group cut to its own
  longest prompt (one left-padded batch would run every row over the longest prompt of the call);
- every further token is one call of a fixed-shape *step*: embed → layers (attention over the
  cache up to an ``active`` length) → LM head → repetition penalty, EOS suppression before
  ``min_new_tokens``, temperature, top-p → sample → write the token, its log-prob and the next
  inputs into the state's buffers. On CUDA each (state, active length, sampling mode) step is
  captured once as a CUDA graph and then replayed: one launch per token, no Python in between;
- rows are rounded up to powers of two and lengths to a short ladder (64, 96, 128, 192, 256, ...)
  so that states and graphs are reused across calls and training steps;
- the step reads the model's parameters where they live, so an optimiser step (which updates them
  in place) needs no recapture. If a parameter is *replaced* (new storage, e.g. ``.to()`` or
  ``load_state_dict(assign=True)``), every graph is dropped and recaptured on next use.

The forward is this module's own, written against the modules of Llama-family decoders (model
types ``llama``, ``qwen2``, ``qwen3``, ``mistral``: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
Qwen3's ``q_norm``/``k_norm``, ``mlp``, the RMSNorms, ``rotary_emb``, ``lm_head``), so it does not
depend on the cache API of one transformers release. A peft LoRA wrapper is fine: its layers are
called as modules. Other architectures get a one-line error naming ``decode: generate``.

Equivalence with ``generate`` (tested on CPU, where graphs are off): the same left padding and
position ids, the logits processors in generate's order (repetition penalty from the model's
``generation_config``, EOS suppressed before ``generation_config.min_new_tokens``, temperature,
then top-p exactly as transformers' ``TopPLogitsWarper``), EOS ends a row and pads the rest, stop
strings end a row as generate's ``StopStringCriteria`` does (matched in the generated text only, as
vLLM does; generate also stops on one that begins in the prompt). With ``sampler="multinomial"`` (the
CPU default) tokens are drawn by ``torch.multinomial`` over the real rows, consuming the RNG as
generate does, so a seeded call returns generate's ids; with ``sampler="race"`` (the default when
graphs are on) a token is ``argmax(p / E)`` with ``E ~ Exp(1)``, which draws from ``p`` exactly and
needs no host synchronisation inside a graph.

Shapes: B rows (a bucket ≥ the real rows n), W prompt width (the longest prompt), L cache length,
T = max_new_tokens, V vocabulary, H / KV query / key-value heads, D head dim. Log-probs are float32
nats under the processed (sampling) distribution, as :class:`~mlmt_bench.rollout.backend.Generation`
documents.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from mlmt_bench.errors import UserError
from mlmt_bench.rollout.stops import StopStrings

log = logging.getLogger(__name__)

#: model types whose decoder layers this module knows how to run
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")

#: generation_config settings that plain generate would apply and this path does not implement,
#: with their "off" values: a model that sets one of them is refused rather than decoded differently
_UNSUPPORTED_GENERATION_CONFIG = {
    "no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "min_length": (None, 0), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "min_p": (None,), "sequence_bias": (None,), "encoder_repetition_penalty": (None, 1.0),
    "exponential_decay_length_penalty": (None,), "renormalize_logits": (None, False),
}

#: ``compact``: rows are dropped once at most this share of a step's rows is still generating
COMPACT_AT = 0.75

#: prompt tokens (rows × the group's longest prompt) one prefill forward runs on at most, unless one
#: prompt alone is longer: rows are grouped by length (:func:`prefill_groups`)
PREFILL_TOKENS = 4096

#: cache lengths (and active lengths) are rounded up to this ladder: ≤ 50 % waste, few distinct graphs
def _length_ladder(n: int, minimum: int = 64) -> int:
    """Smallest value ≥ n in 64, 96, 128, 192, 256, 384, 512, ... (powers of two and 1.5× them)."""
    size = minimum
    while True:
        if n <= size:
            return size
        if n <= size * 3 // 2:
            return size * 3 // 2
        size *= 2


def prefill_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices grouped for prefill: rows by length, longest first (ties in row order), each
    group as many rows as fit ``rows × its longest length ≤ max_tokens`` (at least one). E.g.
    lengths ``[3, 9, 4, 8]`` with 20 tokens → ``[[1, 3], [2, 0]]`` (9 + 9 ≤ 20; then 4 + 4)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * max(1, lengths[groups[-1][0]]) <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def first_of_each(prompts: list[list[int]]) -> list[int]:
    """Per row, the first row with the same prompt (the row itself if none before it has it):
    ``[[1, 2], [3], [1, 2], [1, 2]]`` → ``[0, 1, 0, 0]``. A group's G samples of one problem repeat
    its prompt, so their prefill is computed once."""
    first: dict[tuple[int, ...], int] = {}
    return [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Mode:
    """What a step graph bakes in: greedy or sampling, and which processors run."""

    greedy: bool
    top_p: bool
    penalty: bool
    sampler: str  # "multinomial" | "race" (unused when greedy)


@dataclass
class _State:
    """Buffers of one (rows, cache length) bucket; every step reads and writes only these."""

    rows: int
    length: int
    k: list[torch.Tensor]  # per layer [B, KV, L, D]
    v: list[torch.Tensor]
    ids: torch.Tensor  # [B] long: the token fed to the next step
    pos: torch.Tensor  # [B] long: its position id
    slot: torch.Tensor  # [1] long: the cache slot it is written to
    step: torch.Tensor  # [1] long: the column of out_* the step writes
    key_mask: torch.Tensor  # [B, L] bool: cache slots a query may attend to
    done: torch.Tensor  # [B] bool
    out_ids: torch.Tensor  # [B, L] long (column t: the t-th generated token)
    out_lp: torch.Tensor  # [B, L] float32
    temp: torch.Tensor  # [1] float32
    top_p_floor: torch.Tensor  # [1] float32: 1 - top_p, computed in double as generate does
    penalty: torch.Tensor  # [1] float32: repetition penalty
    min_new: torch.Tensor  # [1] long: EOS suppressed while step < min_new
    seen: torch.Tensor | None = None  # [B, V] bool, only with a repetition penalty
    nbytes: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return self.rows, self.length


@dataclass
class _Prefix:
    """Keys and values of one sequence a call fed (its prompt, then its generated tokens but the
    last): per layer ``[KV, m, D]`` for its ``m`` tokens ``ids``, as the cache held them."""

    ids: tuple[int, ...]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    nbytes: int


@dataclass
class DecodeStats:
    """Counters for benchmarks: what ran, and how long the decode loops took (seconds)."""

    calls: int = 0
    tokens: int = 0
    steps: int = 0
    decode_s: float = 0.0
    graph_replays: int = 0
    graphs_captured: int = 0
    recaptures: int = 0
    capture_s: float = 0.0
    row_steps: int = 0  # rows a decode step ran on, summed over steps (less with ``compact``)
    compactions: int = 0
    prefix_rows: int = 0  # prompts whose kept prefix was copied, not computed (``prefix_cache_mb``)
    prefix_tokens: int = 0  # prompt tokens whose keys and values were copied instead of computed
    shared_rows: int = 0  # rows whose prompt an earlier row of the call repeats (``share_prompts``)
    shared_tokens: int = 0  # their prompt tokens, computed once for the first such row
    graph_failures: list[str] = field(default_factory=list)


class _Arch:
    """The modules of a Llama-family decoder that the step calls, and its attention geometry."""

    def __init__(self, model: Any, merge_lora: bool = False) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(f"backend hf: decode 'static' supports model types {', '.join(SUPPORTED_MODEL_TYPES)}, "
                            f"not {model_type!r}; use decode: generate")
        inner = getattr(base, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(base, "lm_head"):
            raise UserError(f"backend hf: decode 'static': {type(base).__name__} does not have the Llama module "
                            f"layout (model.embed_tokens/layers/norm/rotary_emb, lm_head); use decode: generate")
        if getattr(cfg, "use_sliding_window", False):
            raise UserError("backend hf: decode 'static' does not implement sliding-window attention; "
                            "use decode: generate")
        self.sliding_window = getattr(cfg, "sliding_window", None) if model_type == "mistral" else None
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        self.lm_head = base.lm_head
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        self.scaling = getattr(self.layers[0].self_attn, "scaling", self.head_dim ** -0.5)
        self.vocab = self.lm_head.out_features if hasattr(self.lm_head, "out_features") else cfg.vocab_size
        self.merged = MergedLinears(self.layers) if merge_lora else None

    def linear(self, module: Any, h: torch.Tensor) -> torch.Tensor:
        """``module(h)``, with its merged weight where LoRA layers are merged."""
        return module(h) if self.merged is None else self.merged.linear(module, h)

    def mlp(self, mlp: Any, h: torch.Tensor) -> torch.Tensor:
        """The gated MLP of a Llama-family layer: ``down(act(gate(h)) * up(h))``."""
        if self.merged is None:
            return mlp(h)
        return self.linear(mlp.down_proj, mlp.act_fn(self.linear(mlp.gate_proj, h)) * self.linear(mlp.up_proj, h))

    def qkv(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries ``[B, H, S, D]`` and keys, values ``[B, KV, S, D]`` of ``h [B, S, hidden]``."""
        attn = layer.self_attn
        b, s, _ = h.shape
        q = self.linear(attn.q_proj, h).view(b, s, self.heads, self.head_dim)
        k = self.linear(attn.k_proj, h).view(b, s, self.kv_heads, self.head_dim)
        v = self.linear(attn.v_proj, h).view(b, s, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def finish_layer(self, layer: Any, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual stream after the attention output ``o [B, H, S, D]`` and the MLP."""
        b, _, s, _ = o.shape
        x = x + self.linear(layer.self_attn.o_proj, o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        return x + self.mlp(layer.mlp, layer.post_attention_layernorm(x))


#: the linear layers of a Llama-family decoder layer that LoRA adapts (``all-linear``), by path
_LAYER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class MergedLinears:
    """``merge_lora``: the LoRA linear layers of a decoder's layers, each run as one matrix product
    ``F.linear(h, W + ΔW, b)`` with ``ΔW = s·B·A`` of its active adapters
    (:func:`mlmt_bench.models.lora_weights.merged_weight`), instead of peft's five operations
    (the base product, the adapter's two, its scaling and the sum).

    :meth:`refresh` makes every merged weight again from the current base and adapter weights, so
    an optimiser step, a switched adapter (a shared base's roles) or weights loaded from a
    checkpoint can never leave a stale one; the decoder calls it at the start of every call (one
    fused ``addmm`` per layer, :func:`~mlmt_bench.models.lora_weights.merge_into`). It writes into
    the same tensors each time, so a captured CUDA graph reads the new values. Memory: one copy of every
    adapted weight (SmolLM2-135M: ~106M parameters). The model is never modified. Layers that are
    not LoRA layers, and layers whose adapters are off or already merged, run as they are. DoRA's
    merged weight is not ``W + BA``: refused, one line. So are products in a 16-bit dtype (weights
    in bfloat16 or float16, or autocast to one): rounded to 8 or 11 significant bits, ``W + ΔW``
    loses the small updates an adapter makes, which ``x·W + s·(x·A)·B`` keeps.
    """

    def __init__(self, layers: Any) -> None:
        from mlmt_bench.models.lora_weights import lora_layers, uses_dora

        self.modules: list[Any] = []
        for layer in layers:
            found = lora_layers(layer)
            self.modules += [found[path] for path in _LAYER_LINEARS if path in found]
        if any(uses_dora(m) for m in self.modules):
            raise UserError("backend hf: options.merge_lora cannot merge DoRA adapters; set merge_lora: false")
        mlp = layers[0].mlp if len(layers) else None
        if mlp is not None and not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            raise UserError(f"backend hf: options.merge_lora: {type(mlp).__name__} is not a gated MLP "
                            "(gate_proj, up_proj, down_proj, act_fn); set merge_lora: false")
        self.weights: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def refresh(self) -> bool:
        """Every adapted layer's merged weight, from its weights as they are now; whether a weight
        tensor was added or dropped (a captured graph then reads the wrong ones)."""
        from mlmt_bench.models.lora_weights import applies_adapters, merge_into

        if not self.modules:  # no adapter (a frozen critic): nothing to merge, the model runs as it is
            return False
        low = {m.base_layer.weight.dtype for m in self.modules} - {torch.float32, torch.float64}
        device = self.modules[0].base_layer.weight.device.type
        if torch.is_autocast_enabled(device):
            low.add(torch.get_autocast_dtype(device))
        if low:
            raise UserError(f"backend hf: options.merge_lora needs float32 products, these run in "
                            f"{', '.join(sorted(str(d).removeprefix('torch.') for d in low))}: W + ΔW rounded to "
                            "16 bits loses an adapter's small updates; set merge_lora: false (or train.cpu_dtype: "
                            "float32)")
        changed = False
        for m in self.modules:
            if not applies_adapters(m):
                changed |= self.weights.pop(id(m), None) is not None  # runs as the module does
                continue
            old = self.weights.get(id(m))
            self.weights[id(m)] = merge_into(m, old)
            changed |= self.weights[id(m)] is not old
        return changed

    def linear(self, module: Any, h: torch.Tensor) -> torch.Tensor:
        """``module(h)`` computed with its merged weight (as the module, where it has none)."""
        w = self.weights.get(id(module))
        if w is None:
            return module(h)
        return F.linear(h, w, module.base_layer.bias)


def _compacted(st: _State, keep: torch.Tensor) -> _State:
    """``st`` on rows ``keep`` alone (``[m]`` indices, ascending): each per-row buffer's rows
    ``keep`` are moved to its first ``m`` rows (in place: ``st``'s buffers are refilled by the next
    call) and the state returned views those; the per-call scalars are shared."""
    m = len(keep)

    def front(t: torch.Tensor) -> torch.Tensor:
        t[:m] = t.index_select(0, keep)  # index_select copies first, so the rows may overlap
        return t[:m]

    return dataclasses.replace(
        st, rows=m, k=[front(t) for t in st.k], v=[front(t) for t in st.v], ids=front(st.ids), pos=front(st.pos),
        key_mask=front(st.key_mask), done=front(st.done), out_ids=front(st.out_ids), out_lp=front(st.out_lp),
        seen=None if st.seen is None else front(st.seen))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float,
                      groups: int) -> torch.Tensor:
    """One query per row over the cache: ``q [B, H, 1, D]``, ``k, v [B, KV, A, D]``, ``mask [B, A]``.

    Queries of the ``groups`` heads that share a key-value head are batched into one matmul, so the
    cache is read once per key-value head (no repeat of K and V). Softmax in float32.
    """
    b, h, _, d = q.shape
    kv = k.shape[1]
    scores = torch.matmul(q.reshape(b, kv, groups, d), k.transpose(-1, -2)).float() * scaling  # [B, KV, G, A]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).reshape(b, h, 1, d)


class StaticDecoder:
    """Static-cache generation for one model (see the module docstring).

    ``graphs``: capture decode steps as CUDA graphs (needs a CUDA model). ``buckets``: round rows to
    powers of two and lengths to the ladder (needed for graph reuse; on the CPU it only adds work,
    but tests use it to show bucketing changes no result). ``max_cache_mb``: budget for the KV
    caches of all states of this model; a call whose rows do not fit is split into smaller chunks and
    least recently used states are freed. ``sync_every``: decode steps between checks (on the host)
    of whether every row has finished; on a GPU each check is a synchronisation. ``sampler``:
    ``multinomial`` (generate's draws) or ``race`` (graph-safe). ``keep_cache``: keep the states
    (KV caches and their graphs) between calls for the next call of the same shape; without
    graphs a state is only a zero-filled buffer, cheap to remake, and shapes rarely repeat
    unbucketed, so a CPU run that kept them held up to four caches of gigabytes per model.
    ``compact``: at a check, once at most :data:`COMPACT_AT` of the rows a step runs on are still
    generating, move those to the front and step on them alone (without graphs only: a graph's
    shapes are fixed). Rows end at different lengths, and every step costs in proportion to its
    rows; the smaller matrix products may round differently from the full batch's (the ids then
    part from generate's where two logits are that close), and seeded sampling draws for fewer
    rows than generate does, so a seed no longer gives generate's draws. ``merge_lora``: run each
    LoRA linear layer of the decoder's layers as one product with its merged weight
    (:class:`MergedLinears`). ``prefix_cache_mb``: budget (0: off) for keeping the keys and values
    of the sequences a call marked ``keep`` fed (a rollout's attempts), so that a later prompt
    that begins with one of them (its refinements, which repeat the attempt's prompt and tokens)
    computes only the rest; kept per weights (a parameter updated in place, replaced, or another
    adapter active, and they are not used), the last such call's only. The kept keys and values
    of generated tokens are the decode steps', which round differently from a prefill's, so ids
    can part from generate's where two logits are that close. Not with ``compact`` (compacted
    rows leave the state). ``share_prompts``: rows of a chunk with the same prompt (a group's
    samples of one problem) are prefilled once (:func:`first_of_each`); the others copy its keys,
    values and first-token logits (in tests, generate's ids and log-probs as before).
    """

    def __init__(self, model: Any, *, graphs: bool, buckets: bool, max_cache_mb: float | None,
                 sync_every: int, sampler: str, max_rows: int, keep_cache: bool = True, compact: bool = False,
                 merge_lora: bool = False, prefix_cache_mb: float = 0, share_prompts: bool = True) -> None:
        self.model = model
        self.share_prompts = share_prompts
        self.arch = _Arch(model, merge_lora=merge_lora)
        self.graphs = graphs
        self.buckets = buckets
        self.keep_cache = keep_cache
        self.compact = compact and not graphs
        self.max_cache_bytes = None if max_cache_mb is None else int(max_cache_mb * 2 ** 20)
        self.sync_every = max(1, int(sync_every))
        if sampler not in ("multinomial", "race"):
            raise UserError(f"backend hf: sampler must be multinomial or race, got {sampler!r}")
        if graphs and sampler == "multinomial":
            raise UserError("backend hf: sampler 'multinomial' cannot run inside CUDA graphs; "
                            "use race or graphs: false")
        self.sampler = sampler
        self.max_rows = max(1, int(max_rows))
        self.states: OrderedDict[tuple[int, int], _State] = OrderedDict()
        self._graphs: dict[tuple, Any] = {}
        self._pool: Any = None
        self._param_ptrs: tuple[int, ...] | None = None
        self.stats = DecodeStats()
        self._lora: list[Any] | None = None
        if prefix_cache_mb and compact:
            raise UserError("static decoder: prefix_cache_mb needs compact off")
        self.prefix_bytes = int(float(prefix_cache_mb) * 2 ** 20)
        self._prefixes: dict[tuple, dict[int, dict[tuple[int, ...], _Prefix]]] = {}  # weights -> length -> ids

    # ------------------------------------------------------------------------------------------
    # public

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 eos_id: int | None, pad_id: int, stops: StopStrings | None = None,
                 min_new_tokens: int = 0, keep: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Generated ids ``[n, T']`` (long) and their log-probs ``[n, T']`` (float32), on the CPU.

        ``T' ≤ max_new_tokens`` is the number of steps until every row finished (as generate's
        ``sequences``); a row ends at its first EOS or at the end of its first stop string and is
        padded with ``pad_id`` after it. EOS is suppressed while fewer than ``min_new_tokens`` tokens
        were generated (generate's ``min_new_tokens``). ``keep``: with ``prefix_cache_mb``, keep
        what these rows feed (replacing what an earlier ``keep`` call of these weights kept).
        """
        if not prompts:
            return torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0))
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        gen_cfg = getattr(self.model, "generation_config", None)
        _check_generation_config(gen_cfg)
        mode = Mode(greedy=temperature <= 0, top_p=temperature > 0 and top_p < 1.0,
                    penalty=_penalty(gen_cfg) != 1.0, sampler=self.sampler)
        width = max(len(p) for p in prompts)
        length = self._cache_length(width + max_new_tokens - 1)
        if self.arch.sliding_window is not None and length > self.arch.sliding_window:
            raise UserError(f"backend hf: decode 'static': cache length {length} exceeds the model's sliding window "
                            f"{self.arch.sliding_window}; use decode: generate")
        self.check_params()
        if self.arch.merged is not None and self.arch.merged.refresh():
            self.invalidate()
        rows_cap = self._rows_cap(length)
        reuse: list[_Prefix | None] = [None] * len(prompts)
        kept: dict[int, dict[tuple[int, ...], _Prefix]] | None = None
        if self.prefix_bytes:
            weights = self._weights_key()
            self._prefixes = {w: e for w, e in self._prefixes.items() if w[0] == weights[0]}
            reuse = self._find_prefixes(prompts, self._prefixes.get(weights, {}))
            if keep:
                kept = self._prefixes[weights] = {}
        was_training = self.model.training
        self.model.eval()
        outs: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            with _nondeterministic_indexing():
                for start in range(0, len(prompts), rows_cap):
                    outs.append(self._generate_chunk(prompts[start:start + rows_cap], width, length, max_new_tokens,
                                                     temperature, top_p, eos_id, pad_id, mode, gen_cfg, stops,
                                                     min_new_tokens, reuse[start:start + rows_cap], kept))
        finally:
            self.model.train(was_training)
            if not self.keep_cache:
                for key in list(self.states):
                    self._evict(key)
        steps = max(o[0].shape[1] for o in outs)
        ids = torch.cat([F.pad(o[0], (0, steps - o[0].shape[1]), value=pad_id) for o in outs])
        lps = torch.cat([F.pad(o[1], (0, steps - o[1].shape[1])) for o in outs])
        self.stats.calls += 1
        return ids, lps

    def invalidate(self) -> None:
        """Drop every captured graph (they are recaptured on next use)."""
        if self._graphs:
            self.stats.recaptures += 1
        self._graphs.clear()
        self._param_ptrs = None

    # ------------------------------------------------------------------------------------------
    # shapes and states

    def _weights_key(self) -> tuple:
        """What kept keys and values were computed with: every parameter's storage and in-place
        version (an optimiser step bumps it), then each LoRA layer's active adapters and whether it
        applies them (``(params, adapters)``)."""
        from mlmt_bench.models.lora_weights import active_adapters, applies_adapters, lora_layers

        params = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if self._lora is None:
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            self._lora = list(lora_layers(base).values())
        return params, tuple((applies_adapters(m), tuple(active_adapters(m))) for m in self._lora)

    @staticmethod
    def _find_prefixes(prompts: list[list[int]], kept: dict[int, dict[tuple[int, ...], _Prefix]]
                       ) -> list[_Prefix | None]:
        """Per prompt, the longest kept sequence it begins with and goes beyond, or None."""
        lengths = sorted(kept, reverse=True)
        found: list[_Prefix | None] = []
        for p in prompts:
            hit = None
            for m in lengths:
                if m < len(p):
                    hit = kept[m].get(tuple(p[:m]))
                    if hit is not None:
                        break
            found.append(hit)
        return found

    def _keep_prefixes(self, st: _State, prompts: list[list[int]], width: int, fed: list[int],
                       kept: dict[int, dict[tuple[int, ...], _Prefix]]) -> None:
        """Copy each row's keys and values of its prompt and its first ``fed[i]`` generated tokens
        out of the state, while the budget lasts."""
        used = sum(e.nbytes for by_len in self._prefixes.values() for es in by_len.values() for e in es.values())
        per_token = self._kv_bytes_per_row_token()
        for i, p in enumerate(prompts):
            m = len(p) + fed[i]
            if used + m * per_token > self.prefix_bytes:
                break
            lo, hi = width - len(p), width + fed[i]
            ids = tuple(p) + tuple(st.out_ids[i, :fed[i]].tolist())
            entry = _Prefix(ids, [k[i, :, lo:hi].clone() for k in st.k], [v[i, :, lo:hi].clone() for v in st.v],
                            m * per_token)
            kept.setdefault(m, {})[ids] = entry
            used += entry.nbytes

    def _cache_length(self, needed: int) -> int:
        return _length_ladder(needed) if self.buckets else needed

    def _kv_bytes_per_row_token(self) -> int:
        a = self.arch
        dtype = next(self.model.parameters()).dtype
        return 2 * len(a.layers) * a.kv_heads * a.head_dim * torch.finfo(dtype).bits // 8

    def _rows_cap(self, length: int) -> int:
        cap = self.max_rows
        if self.max_cache_bytes is not None:
            fit = self.max_cache_bytes // max(1, length * self._kv_bytes_per_row_token())
            cap = min(cap, max(1, fit))
        if self.buckets:
            cap = 1 << (cap.bit_length() - 1)  # a power of two, so full chunks hit one bucket
        return cap

    def _state(self, rows: int, length: int) -> _State:
        key = (rows, length)
        st = self.states.get(key)
        if st is not None:
            self.states.move_to_end(key)
            return st
        need = rows * length * self._kv_bytes_per_row_token()
        while self.states and (len(self.states) >= 4 or (
                self.max_cache_bytes is not None and sum(s.nbytes for s in self.states.values()) + need
                > self.max_cache_bytes)):
            self._evict(next(iter(self.states)))
        st = self._new_state(rows, length)
        self.states[key] = st
        return st

    def _evict(self, key: tuple[int, int]) -> None:
        self.states.pop(key)
        for gk in [k for k in self._graphs if k[0] == key]:
            del self._graphs[gk]

    def _new_state(self, rows: int, length: int) -> _State:
        a = self.arch
        p = next(self.model.parameters())
        dev, dtype = p.device, p.dtype
        shape = (rows, a.kv_heads, length, a.head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in a.layers]
        v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in a.layers]

        def scalar(value: float, dt: torch.dtype) -> torch.Tensor:
            return torch.full((1,), value, dtype=dt, device=dev)

        return _State(
            rows=rows, length=length, k=k, v=v,
            ids=torch.zeros(rows, dtype=torch.long, device=dev), pos=torch.zeros(rows, dtype=torch.long, device=dev),
            slot=scalar(0, torch.long), step=scalar(0, torch.long),
            key_mask=torch.zeros((rows, length), dtype=torch.bool, device=dev),
            done=torch.zeros(rows, dtype=torch.bool, device=dev),
            out_ids=torch.zeros((rows, length), dtype=torch.long, device=dev),
            out_lp=torch.zeros((rows, length), dtype=torch.float32, device=dev),
            temp=scalar(1.0, torch.float32),
            top_p_floor=scalar(0.0, torch.float32),
            penalty=scalar(1.0, torch.float32), min_new=scalar(0, torch.long),
            nbytes=2 * sum(t.numel() * t.element_size() for t in k),
        )

    def check_params(self) -> None:
        """Graphs hold parameter addresses: drop them if any parameter got new storage."""
        ptrs = tuple(p.data_ptr() for p in self.model.parameters())
        if self._param_ptrs is not None and ptrs != self._param_ptrs:
            self.invalidate()
        self._param_ptrs = ptrs

    # ------------------------------------------------------------------------------------------
    # one chunk of rows

    def _generate_chunk(self, prompts, width, length, max_new, temperature, top_p, eos_id, pad_id, mode, gen_cfg,
                        stops, min_new_tokens, reuse, kept):
        n = len(prompts)
        rows = _pow2(n) if self.buckets else n
        st = self._state(rows, length)
        dev = st.ids.device
        if mode.penalty and (st.seen is None):
            st.seen = torch.zeros((rows, self.arch.vocab), dtype=torch.bool, device=dev)
        # Graphs for every active length this call will use, captured before the state is filled
        # (capturing runs the step on the buffers).
        actives = sorted({self._active(width + t, length) for t in range(max_new - 1)})
        for a in actives:
            if not self.graphs:  # off, or a capture failed
                break
            self._graph(st, a, mode, eos_id, pad_id)

        # Fill the buffers: prompts (left padded; dummy rows get one pad token), settings.
        ids = torch.full((rows, width), pad_id, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.bool)
        padded = [prompts[i] if i < n else [pad_id] for i in range(rows)]
        for i, p in enumerate(padded):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = True
        first = first_of_each(padded) if self.share_prompts else list(range(rows))
        ids, mask = ids.to(dev), mask.to(dev)
        st.key_mask.zero_()
        st.key_mask[:, :width] = mask
        st.done.zero_()
        st.done[n:] = True
        st.out_ids.fill_(pad_id)
        st.out_lp.zero_()
        if temperature > 0:
            st.temp.fill_(float(temperature))
        st.top_p_floor.fill_(1 - float(top_p))
        st.penalty.fill_(_penalty(gen_cfg))
        st.min_new.fill_(int(min_new_tokens))
        if mode.penalty:
            assert st.seen is not None  # allocated with a penalty mode
            st.seen.zero_()
            st.seen.scatter_(1, ids.clamp(max=self.arch.vocab - 1), True)

        t0 = time.perf_counter()
        self._prefill(st, ids, mask, mode, eos_id, pad_id, n, reuse, first)
        # ``work``: the rows the steps run on, ``st`` itself or (compact) its unfinished rows moved to
        # the front; ``origin[j]``: the chunk row of work's row j; ``out_*``: the rows compacted away
        work, live, origin = st, n, torch.arange(n, device=dev)
        out_ids = torch.full((n, max_new), pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((n, max_new), dtype=torch.float32, device=dev)
        steps, checked = 1, 0
        while steps < max_new:
            self._run_step(work, self._active(width + steps - 1, length), mode, eos_id, pad_id, live)
            self.stats.row_steps += work.rows
            steps += 1
            if steps % self.sync_every == 0:
                if stops is not None:
                    self._end_stopped_rows(work, live, steps, checked, stops)
                    checked = steps
                going = ~work.done[:live]
                if not bool(going.any()):
                    break
                if self.compact and int(going.sum()) <= COMPACT_AT * work.rows:
                    ended = (~going).nonzero().squeeze(1)
                    out_ids[origin[ended], :steps] = work.out_ids[ended, :steps]
                    out_lp[origin[ended], :steps] = work.out_lp[ended, :steps]
                    keep = going.nonzero().squeeze(1)
                    work, live, origin = _compacted(work, keep), len(keep), origin[keep]
                    self.stats.compactions += 1
        out_ids[origin, :steps] = work.out_ids[:live, :steps]
        out_lp[origin, :steps] = work.out_lp[:live, :steps]
        # copies: the state's buffers are reused by the next chunk (.cpu() of a CPU tensor is no copy)
        out_ids = out_ids[:, :steps].to("cpu", copy=True)
        out_lp = out_lp[:, :steps].to("cpu", copy=True)
        ids, lps, ends = _trim(out_ids, out_lp, eos_id, pad_id, stops)
        tokens = sum(ends)
        if kept is not None:  # generated token t was fed (its keys computed) by step t + 1, if that ran
            self._keep_prefixes(st, prompts, width, [min(e, steps - 1) for e in ends], kept)
        self.stats.steps += steps
        self.stats.tokens += tokens
        self.stats.decode_s += time.perf_counter() - t0
        return ids, lps

    def _end_stopped_rows(self, st: _State, n: int, steps: int, checked: int, stops: StopStrings) -> None:
        """Mark done the unfinished rows whose tokens since the last check complete a stop string
        (only to end the loop early: :func:`_trim` finds where each row ends)."""
        done = st.done[:n].tolist()
        live = [i for i in range(n) if not done[i]]
        if not live:
            return
        start = max(0, checked - stops.max_tokens)
        hits = stops.seen(st.out_ids[live, start:steps].tolist())
        marked = [i for i, hit in zip(live, hits) if hit]
        if marked:
            st.done[torch.tensor(marked, device=st.done.device)] = True

    def _active(self, slot: int, length: int) -> int:
        """Cache slots the step at ``slot`` attends over: ``slot + 1``, rounded up (buckets) to a
        multiple of an eighth of the cache length."""
        if not self.buckets:
            return slot + 1
        chunk = max(16, length // 8)
        return min(length, -(-(slot + 1) // chunk) * chunk)

    # ------------------------------------------------------------------------------------------
    # the computation

    def _prefill(self, st: _State, ids: torch.Tensor, mask: torch.Tensor, mode: Mode, eos_id, pad_id, n: int,
                 reuse: list[_Prefix | None], first: list[int]) -> None:
        """Forward over the prompts (eager), first token, and the state for the first decode step.

        ``ids``/``mask`` ``[B, W]`` are left padded to the longest prompt; row ``i`` of length ``ℓ``
        has its keys and values in cache slots ``W - ℓ .. W - 1`` (the slots before them keep what
        an earlier chunk or call left there, finite values never attended: ``key_mask`` is false
        there, so their weight is exactly 0). A row with a kept prefix (``reuse[i]``, its
        first ``m`` tokens) needs only its last ``ℓ - m`` computed. The forward runs on
        :func:`prefill_groups` of rows by the tokens they need: a group computes its last ``r``
        slots (``r``: its largest need), copies each row's kept keys and values before them, and
        attends over the group's longest prompt; a short prompt beside a long one costs its own
        tokens, not ``W``. A row whose prompt an earlier row repeats (``first[i] != i``) is not
        computed: it gets that row's keys, values and first-token logits."""
        a = self.arch
        rows, width = ids.shape
        dev = ids.device
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        lengths = mask.sum(-1).clamp(min=1).tolist()
        cached = [0] * rows
        for i, kept in enumerate(reuse):
            cached[i] = 0 if kept is None else len(kept.ids)
        need = [max(1, lengths[i] - cached[i]) for i in range(rows)]
        logits = torch.empty((rows, a.vocab), dtype=torch.float32, device=dev)
        computed = [i for i in range(rows) if first[i] == i]
        for group in prefill_groups([need[i] for i in computed], PREFILL_TOKENS):
            group = [computed[j] for j in group]
            run = need[group[0]]  # slots W - run .. W - 1 are computed
            span = max(run, *(lengths[i] for i in group))  # slots W - span .. W - 1 are attended
            idx = torch.tensor(group, dtype=torch.long, device=dev)
            for i in group:
                copied = lengths[i] - run
                if copied > 0:
                    kept = reuse[i]
                    assert kept is not None  # only a row with a kept prefix needs fewer than its length
                    for layer, (k, v) in enumerate(zip(st.k, st.v)):
                        k[i, :, width - lengths[i]:width - run] = kept.k[layer][:, :copied]
                        v[i, :, width - lengths[i]:width - run] = kept.v[layer][:, :copied]
                    self.stats.prefix_rows += 1
                    self.stats.prefix_tokens += copied
            # query j (slot W - run + j) attends to key t (slot W - span + t) at or before it, and to itself
            causal = torch.ones((run, span), dtype=torch.bool, device=dev).tril(diagonal=span - run)
            own = torch.zeros((run, span), dtype=torch.bool, device=dev)
            own[:, span - run:] = torch.eye(run, dtype=torch.bool, device=dev)
            attend = (causal[None] & mask[idx, width - span:][:, None, :]) | own[None]
            x = a.embed(ids[idx, width - run:])
            cos, sin = a.rotary(x, pos[idx, width - run:])
            for i, layer in enumerate(a.layers):
                q, k, v = a.qkv(layer, layer.input_layernorm(x), cos, sin)
                st.k[i][idx, :, width - run:width] = k.to(st.k[i].dtype)
                st.v[i][idx, :, width - run:width] = v.to(st.v[i].dtype)
                if span > run:  # keys and values of the kept prefixes too
                    k, v = st.k[i][idx, :, width - span:width], st.v[i][idx, :, width - span:width]
                if a.groups > 1:  # head h uses key-value head h // groups (transformers' repeat_kv)
                    k, v = k.repeat_interleave(a.groups, dim=1), v.repeat_interleave(a.groups, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None], scale=a.scaling)
                x = a.finish_layer(layer, x, o)
            logits[idx] = a.lm_head(a.norm(x[:, -1:]))[:, -1].float()
        repeats = [i for i in range(rows) if first[i] != i]
        if repeats:  # the same prompt in the same slots: its keys, values and logits are the first row's
            dst = torch.tensor(repeats, dtype=torch.long, device=dev)
            src = torch.tensor([first[i] for i in repeats], dtype=torch.long, device=dev)
            for k, v in zip(st.k, st.v):
                k[dst, :, :width] = k[src, :, :width]
                v[dst, :, :width] = v[src, :, :width]
            logits[dst] = logits[src]
            self.stats.shared_rows += sum(1 for i in repeats if i < n)
            self.stats.shared_tokens += sum(lengths[i] for i in repeats if i < n)
        st.step.zero_()
        nxt, lp = self._choose(st, logits, mode, eos_id, n)
        st.out_ids[:, 0] = nxt
        st.out_lp[:, 0] = lp
        if eos_id is not None:
            st.done |= nxt == eos_id
        st.ids.copy_(nxt)
        st.pos.copy_(pos[:, -1] + 1)
        st.slot.fill_(width)
        st.step.fill_(1)

    def _step(self, st: _State, active: int, mode: Mode, eos_id, pad_id, n: int) -> None:
        """One decode step on the state's buffers; fixed shapes, no host synchronisation."""
        a = self.arch
        if mode.penalty:
            assert st.seen is not None  # allocated with a penalty mode
            st.seen.scatter_(1, st.ids[:, None].clamp(max=a.vocab - 1), True)
        x = a.embed(st.ids[:, None])
        cos, sin = a.rotary(x, st.pos[:, None])
        st.key_mask.index_fill_(1, st.slot, True)
        mask = st.key_mask[:, :active]
        for i, layer in enumerate(a.layers):
            q, k, v = a.qkv(layer, layer.input_layernorm(x), cos, sin)
            # under autocast (bfloat16 matmuls on a CPU) k and v may come out in a lower dtype than the
            # cache's (the weights'): widening them is exact, and autocast narrows them again to attend
            st.k[i].index_copy_(2, st.slot, k.to(st.k[i].dtype))
            st.v[i].index_copy_(2, st.slot, v.to(st.v[i].dtype))
            o = _decode_attention(q, st.k[i][:, :, :active], st.v[i][:, :, :active], mask, a.scaling, a.groups)
            x = a.finish_layer(layer, x, o)
        logits = a.lm_head(a.norm(x))[:, -1].float()
        nxt, lp = self._choose(st, logits, mode, eos_id, n)
        nxt = torch.where(st.done, torch.full_like(nxt, pad_id), nxt)
        st.out_ids.index_copy_(1, st.step, nxt[:, None])
        st.out_lp.index_copy_(1, st.step, lp[:, None])
        if eos_id is not None:
            st.done |= nxt == eos_id
        st.ids.copy_(nxt)
        st.pos += 1
        st.slot += 1
        st.step += 1

    def _choose(self, st: _State, logits: torch.Tensor, mode: Mode, eos_id, n: int):
        """Next token ``[B]`` and its log-prob under the processed distribution, from ``logits [B, V]``
        (float32). Processors in generate's order: repetition penalty, EOS suppression before
        min_new_tokens, then (sampling) temperature and top-p."""
        if mode.penalty:
            assert st.seen is not None  # allocated with a penalty mode
            pen = torch.where(logits < 0, logits * st.penalty, logits / st.penalty)
            logits = torch.where(st.seen, pen, logits)
        if eos_id is not None:
            eos = logits[:, eos_id]
            logits = logits.clone()
            logits[:, eos_id] = torch.where(st.step < st.min_new, torch.full_like(eos, float("-inf")), eos)
        if mode.greedy:
            nxt = logits.argmax(-1)
        else:
            logits = logits / st.temp
            if mode.top_p:
                logits = _top_p(logits, st.top_p_floor)
            probs = torch.softmax(logits, dim=-1)
            if mode.sampler == "race":
                # clamp: a zero draw would make 0 / 0 = NaN for a token outside the nucleus
                nxt = (probs / torch.empty_like(probs).exponential_().clamp_(min=1e-30)).argmax(-1)
            else:  # generate's draws: multinomial over the real rows only (the dummy rows take argmax)
                nxt = probs.argmax(-1)
                nxt[:n] = torch.multinomial(probs[:n], num_samples=1).squeeze(1)
        lp = torch.log_softmax(logits, dim=-1).gather(1, nxt[:, None]).squeeze(1)
        return nxt, lp

    # ------------------------------------------------------------------------------------------
    # CUDA graphs

    def _run_step(self, st: _State, active: int, mode: Mode, eos_id, pad_id, n: int) -> None:
        g = self._graphs.get((st.key, active, mode, eos_id, pad_id)) if self.graphs else None
        if g is None:
            self._step(st, active, mode, eos_id, pad_id, n)
        else:
            g.replay()
            self.stats.graph_replays += 1

    def _graph(self, st: _State, active: int, mode: Mode, eos_id, pad_id) -> Any:
        key = (st.key, active, mode, eos_id, pad_id)
        if key in self._graphs:
            return self._graphs[key]
        t0 = time.perf_counter()
        try:
            graph = self._capture(st, active, mode, eos_id, pad_id)
        except Exception as exc:  # a model whose forward syncs the host cannot be captured: run eagerly
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("static decode: CUDA graph capture failed (%s); decoding without graphs", msg)
            self.stats.graph_failures.append(msg)
            self.graphs = False
            return None
        self._graphs[key] = graph
        self.stats.graphs_captured += 1
        self.stats.capture_s += time.perf_counter() - t0
        return graph

    def _capture(self, st: _State, active: int, mode: Mode, eos_id, pad_id) -> Any:
        """A graph of one decode step at ``active`` on ``st``. Before recording, the counters are set
        so that every index the step writes is in range; the prefill refills the state afterwards."""

        def prepare() -> None:  # not recorded: runs before the capture
            st.slot.fill_(active - 1)
            st.step.fill_(1)
            st.pos.zero_()
            st.ids.zero_()
            st.done.zero_()

        def run() -> None:  # recorded: what every replay repeats, reading all that changes from buffers
            self._step(st, active, mode, eos_id, pad_id, st.rows)

        return self._capture_graph(prepare, run)

    def _capture_graph(self, prepare: Any, run: Any) -> Any:
        """The CUDA mechanics: ``prepare(); run()`` twice on a side stream to warm up (lazy
        initialisations must not happen inside a capture), then ``prepare()`` and ``run()`` recorded
        into a graph that shares this decoder's memory pool (graphs replay one at a time and keep
        nothing between replays but the state's buffers)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                prepare()
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        prepare()
        with torch.cuda.graph(graph, pool=self._pool):
            run()
        torch.cuda.synchronize()
        return graph


@contextlib.contextmanager
def _nondeterministic_indexing():
    """Lift ``torch.use_deterministic_algorithms`` (runs set it) while decoding: under it CUDA's
    ``index_copy_`` takes a sorting path that has no place in a graph. Every index the step writes
    is unique, so the result is the same."""
    on = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        if on:
            torch.use_deterministic_algorithms(True, warn_only=warn_only)


def _trim(ids: torch.Tensor, lps: torch.Tensor, eos_id: int | None, pad_id: int,
          stops: StopStrings | None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Rows as generate returns them: a row ends at its first EOS or at the end of its first stop
    string, whichever comes first, and is padded after it; the batch is as long as its longest row
    (generate stops when the last row finishes, the decode loop only notices at its next check).
    Also returns each row's number of real tokens."""
    n, steps = ids.shape
    ends = []
    for i in range(n):
        row = ids[i].tolist()
        end = row.index(eos_id) + 1 if eos_id is not None and eos_id in row else steps
        stop_end = stops.end(row[:end]) if stops is not None else None
        if stop_end is not None:
            end = stop_end
        ends.append(end)
        ids[i, end:] = pad_id
    longest = max(ends, default=0)
    return ids[:, :longest], lps[:, :longest], ends


def _top_p(scores: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """transformers' TopPLogitsWarper (min_tokens_to_keep = 1) with ``floor = 1 - top_p``."""
    sorted_logits, sorted_idx = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= floor
    remove[..., -1:] = False
    remove = remove.scatter(1, sorted_idx, remove)
    return scores.masked_fill(remove, float("-inf"))


def _penalty(gen_cfg: Any) -> float:
    p = getattr(gen_cfg, "repetition_penalty", None)
    return 1.0 if p is None else float(p)


def _check_generation_config(gen_cfg: Any) -> None:
    """Refuse a model whose generation_config asks for processing this path does not implement."""
    if gen_cfg is None:
        return
    for name, off in _UNSUPPORTED_GENERATION_CONFIG.items():
        value = getattr(gen_cfg, name, None)
        if value not in off:
            raise UserError(f"backend hf: decode 'static' does not implement generation_config.{name}={value!r} "
                            f"(plain generate would apply it); use decode: generate or unset it")
