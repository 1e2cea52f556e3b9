"""The hf backend's static-cache decode path (mlmt_bench/rollout/static_decode.py) against plain
``generate``: identical ids and finish reasons, log-probs to 1e-5, and a sampling distribution that
passes a chi-square test (and whose test fails for a wrong temperature)."""

from __future__ import annotations

import pytest
import torch

from mlmt_bench.errors import UserError
from mlmt_bench.models.tiny import build_tiny_model
from mlmt_bench.models.tokenizer import build_char_tokenizer, encode
from mlmt_bench.rollout.hf_backend import HFBackend
from mlmt_bench.rollout.static_decode import first_of_each, prefill_groups

TEXTS = ["1+2=", "hello there, how", "x", "9-6+9+1 = ?", "abc" * 7, "what is 3*4", "zz", "Q: 12+7;", "the end", "0"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: whole decodes, fast on 2 shared cores


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [encode(tok, s) for s in TEXTS]


def _boost_eos(model, tok, factor: float = 8.0):
    """Make EOS likely (an untrained model rarely emits it), so rows stop at different steps."""
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.eos_token_id] *= factor
    return model


def _llama(tok):
    return _boost_eos(build_tiny_model("tiny-0.5m", tok, seed=0), tok)


def _from_config(tok, kind: str):
    """Tiny qwen2 (q/k/v biases, grouped-query attention), qwen3 (q/k norms) and mistral models."""
    import transformers

    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                  tie_word_embeddings=False)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, **common)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.MistralConfig(sliding_window=None, **common)
        cls = transformers.MistralForCausalLM
    torch.manual_seed(1)
    model = cls(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return _boost_eos(model, tok, 4.0)


def _lora(tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    return get_peft_model(_llama(tok), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False, task_type="CAUSAL_LM"))


MODELS = {"llama": _llama, "qwen2": lambda t: _from_config(t, "qwen2"), "qwen3": lambda t: _from_config(t, "qwen3"),
          "mistral": lambda t: _from_config(t, "mistral"), "llama-lora": _lora}


def _compare(a, b, tol: float = 1e-5) -> None:
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    assert [g.text for g in a] == [g.text for g in b]
    for x, y in zip(a, b):
        assert len(x.logprobs) == len(y.logprobs) == len(x.ids)
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) <= tol


def _both(model, tok, prompts, static_options=None, batch_size=256, **kw):
    plain = HFBackend(batch_size=batch_size).generate(model, tok, prompts, **kw)
    static = HFBackend(batch_size=batch_size, decode="static", **(static_options or {})).generate(
        model, tok, prompts, **kw)
    return plain, static


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("buckets", [False, True])
def test_greedy_ids_and_logprobs_match_generate(tok, prompts, arch, buckets):
    model = MODELS[arch](tok)
    plain, static = _both(model, tok, prompts, {"buckets": buckets}, max_new_tokens=30, temperature=0.0, seed=0)
    reasons = {g.finish_reason for g in plain}
    assert reasons == {"stop", "length"}, "the fixture should stop some rows by EOS and run others to the limit"
    _compare(plain, static)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
@pytest.mark.parametrize("buckets", [False, True])
def test_seeded_sampling_matches_generate(tok, prompts, temperature, top_p, buckets):
    """The multinomial sampler consumes the RNG as generate does: same draws for a seed."""
    model = _llama(tok)
    plain, static = _both(model, tok, prompts, {"buckets": buckets}, max_new_tokens=30, temperature=temperature,
                          top_p=top_p, seed=11)
    assert {g.finish_reason for g in plain} == {"stop", "length"}
    _compare(plain, static)


def test_chunks_of_batch_size_match_generate(tok, prompts):
    plain, static = _both(_llama(tok), tok, prompts, batch_size=3, max_new_tokens=12, temperature=1.0, seed=5)
    _compare(plain, static)


def test_kv_budget_splits_rows_without_changing_greedy_results(tok, prompts):
    model = _llama(tok)
    backend = HFBackend(decode="static", max_cache_mb=0.3, buckets=True, keep_cache=True)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    static = backend.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    _compare(plain, static)
    dec = backend.decoder(model)
    assert max(rows for rows, _ in dec.states) < len(prompts), "the budget should have split the rows"
    assert sum(s.nbytes for s in dec.states.values()) <= 0.3 * 2 ** 20


def test_prefill_groups_take_rows_longest_first_within_a_token_budget():
    assert prefill_groups([3, 9, 4, 8], 20) == [[1, 3], [2, 0]]
    assert prefill_groups([5, 5, 5], 4) == [[0], [1], [2]]  # a prompt longer than the budget runs alone
    assert prefill_groups([2, 2, 2, 2], 100) == [[0, 1, 2, 3]]
    assert prefill_groups([], 10) == []


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-lora"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prompts_prefilled_in_groups_of_their_own_length_match_generate(monkeypatch, tok, prompts, arch,
                                                                        temperature):
    """A small prefill budget splits the call's rows into groups cut to their own longest prompt;
    generate's ids (greedy and seeded draws) and log-probs are unchanged."""
    import mlmt_bench.rollout.static_decode as sd

    widths: list[int] = []
    real = sd.prefill_groups

    def spy(lengths, max_tokens):
        groups = real(lengths, max_tokens)
        widths.extend(lengths[g[0]] for g in groups)
        return groups

    monkeypatch.setattr(sd, "PREFILL_TOKENS", 40)
    monkeypatch.setattr(sd, "prefill_groups", spy)
    plain, static = _both(MODELS[arch](tok), tok, prompts, max_new_tokens=20, temperature=temperature, seed=7)
    _compare(plain, static)
    assert len(widths) >= 4 and min(widths) < max(widths), "the budget should have made groups of several widths"


def test_first_of_each_names_the_first_row_with_the_same_prompt():
    assert first_of_each([[1, 2], [3], [1, 2], [1, 2], [3], [1]]) == [0, 1, 0, 0, 1, 5]
    assert first_of_each([]) == []


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-lora"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_groups_repeated_prompt_is_prefilled_once_with_generates_results(tok, prompts, arch, temperature):
    """A rollout's call repeats each problem's prompt for its G samples: each prompt's keys, values
    and first logits are computed once and copied to its repeats, and every row still gets
    generate's ids (greedy and seeded draws) and log-probs, as it does with sharing off."""
    rows = [p for p in prompts[:4] for _ in range(3)]
    model = MODELS[arch](tok)
    kw = dict(max_new_tokens=20, temperature=temperature, seed=9)
    plain = HFBackend().generate(model, tok, rows, **kw)
    shared = HFBackend(decode="static")
    _compare(plain, shared.generate(model, tok, rows, **kw))
    stats = shared.decoder(model).stats
    assert (stats.shared_rows, stats.shared_tokens) == (8, 2 * sum(len(p) for p in prompts[:4]))
    unshared = HFBackend(decode="static", share_prompts=False)
    _compare(plain, unshared.generate(model, tok, rows, **kw))
    assert unshared.decoder(model).stats.shared_rows == 0
    if temperature > 0:
        assert len({tuple(g.ids) for g in plain[:3]}) > 1, "a group's samples should differ"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prompts_with_kept_prefixes_give_generates_results(tok, prompts, temperature):
    """A rollout's attempts (G repeats of each prompt, marked ``keep``), then refinements that extend
    them, two of them identical: sharing and kept prefixes together still give generate's ids and
    log-probs; each distinct refinement copies its attempt's kept prefix, and repeats are computed once."""
    model = _lora(tok)
    backend, plain = HFBackend(decode="static", prefix_cache_mb=64), HFBackend()
    kw = dict(max_new_tokens=12, temperature=temperature)
    rows = [p for p in prompts[:3] for _ in range(3)]
    first = backend.generate(model, tok, rows, seed=3, keep=True, **kw)
    _compare(plain.generate(model, tok, rows, seed=3, **kw), first)
    later = _extended(rows, first, encode(tok, " again?"))
    later.append(list(later[0]))
    stats = backend.decoder(model).stats
    shared_before = stats.shared_rows
    _compare(plain.generate(model, tok, later, seed=4, **kw), backend.generate(model, tok, later, seed=4, **kw))
    distinct = len({tuple(p) for p in later})  # greedy repeats refine alike, so fewer than 10
    assert stats.prefix_rows == distinct and stats.shared_rows - shared_before == len(later) - distinct >= 1


# ----------------------------------------------------------------------------------------------
# kept prefixes (prefix_cache_mb)


def _extended(prompts, gens, tail):
    """Refinement-like prompts: each prompt, its generated ids, then ``tail`` (a new user turn)."""
    return [p + g.ids + tail for p, g in zip(prompts, gens)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-lora"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prompts_that_extend_a_kept_call_compute_only_their_new_tokens(tok, prompts, arch, temperature):
    """Attempts (marked ``keep``), then two calls of prompts that repeat each attempt's prompt and
    tokens (a refinement after feedback, one after g∅): both later calls copy the kept keys and
    values of every row's attempt and give generate's ids and log-probs."""
    model = MODELS[arch](tok)
    backend = HFBackend(decode="static", prefix_cache_mb=64)
    plain = HFBackend()
    kw = dict(max_new_tokens=20, temperature=temperature)
    first = backend.generate(model, tok, prompts, seed=3, keep=True, **kw)
    _compare(plain.generate(model, tok, prompts, seed=3, **kw), first)
    stats = backend.decoder(model).stats
    assert stats.prefix_rows == 0
    for n, tail in enumerate((encode(tok, " wrong; try again:"), encode(tok, " again?"))):
        later = _extended(prompts, first, tail)
        _compare(plain.generate(model, tok, later, seed=4, **kw), backend.generate(model, tok, later, seed=4, **kw))
        assert stats.prefix_rows == (n + 1) * len(prompts)
    # every row copied its prompt and all of its tokens but the last, twice
    assert stats.prefix_tokens == 2 * sum(len(p) + len(g.ids) - 1 for p, g in zip(prompts, first))


def test_kept_prefixes_are_used_only_with_the_weights_and_adapter_they_were_computed_with(tok, prompts):
    """With another adapter active, with the adapters disabled and after an optimiser step (in
    place), a prompt extending a kept call is computed in full and gives generate's results; back
    on the adapter it was kept with, before any step, it is copied."""
    model = _all_linear_lora(_llama(tok))
    model.add_adapter("other", model.peft_config["default"])
    model.set_adapter("default")
    backend = HFBackend(decode="static", prefix_cache_mb=64)
    stats = backend.decoder(model).stats
    kw = dict(max_new_tokens=16, temperature=0.0)
    first = backend.generate(model, tok, prompts, keep=True, **kw)
    later = _extended(prompts, first, encode(tok, " no"))

    def check(hits: int) -> None:
        _compare(HFBackend().generate(model, tok, later, **kw), backend.generate(model, tok, later, **kw))
        assert stats.prefix_rows == hits

    model.set_adapter("other")
    check(0)
    model.set_adapter("default")
    check(len(prompts))
    with model.disable_adapter():
        check(len(prompts))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    ids = torch.tensor([prompts[1] + prompts[4]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    check(len(prompts))


def test_only_a_call_marked_keep_is_kept_and_it_replaces_what_was(tok, prompts):
    model = _llama(tok)
    backend = HFBackend(decode="static", prefix_cache_mb=64)
    dec = backend.decoder(model)
    kw = dict(max_new_tokens=12, temperature=0.0)
    plain = backend.generate(model, tok, prompts, **kw)
    assert not dec._prefixes
    backend.generate(model, tok, _extended(prompts, plain, encode(tok, "!")), **kw)
    assert dec.stats.prefix_rows == 0
    first = backend.generate(model, tok, prompts[:5], keep=True, **kw)
    second = backend.generate(model, tok, prompts[5:], keep=True, **kw)
    backend.generate(model, tok, _extended(prompts[:5], first, encode(tok, "!")), **kw)
    assert dec.stats.prefix_rows == 0, "the second keep call replaced the first's"
    backend.generate(model, tok, _extended(prompts[5:], second, encode(tok, "!")), **kw)
    assert dec.stats.prefix_rows == 5


def test_kept_prefixes_stay_within_their_budget(monkeypatch, tok, prompts):
    """A budget for a few rows keeps those; their extensions copy them (prefill groups small enough
    that a row needing few tokens is not padded to a long one's), the others are computed."""
    import mlmt_bench.rollout.static_decode as sd

    monkeypatch.setattr(sd, "PREFILL_TOKENS", 40)
    model = _llama(tok)
    backend = HFBackend(decode="static", prefix_cache_mb=0.05)
    first = backend.generate(model, tok, prompts, max_new_tokens=20, temperature=0.0, keep=True)
    dec = backend.decoder(model)
    kept = [e for by_len in dec._prefixes.values() for es in by_len.values() for e in es.values()]
    assert 0 < len(kept) < len(prompts)
    assert sum(e.nbytes for e in kept) <= 0.05 * 2 ** 20
    later = _extended(prompts, first, encode(tok, "?"))
    _compare(HFBackend().generate(model, tok, later, max_new_tokens=20, temperature=0.0),
             backend.generate(model, tok, later, max_new_tokens=20, temperature=0.0))
    assert dec.stats.prefix_rows == len(kept)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_strings_match_generate(tok, prompts, temperature):
    model = _llama(tok)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=temperature, seed=3)
    # stop strings taken from the middle of two rows' own text, so they do occur
    long_rows = [g.text for g in plain if len(g.text) >= 12]
    stop = [long_rows[0][5:7], long_rows[1][8:9]]
    plain, static = _both(model, tok, prompts, max_new_tokens=30, temperature=temperature, seed=3, stop=stop)
    assert sum(g.finish_reason == "stop" and not g.ids[-1] == tok.eos_token_id for g in plain) >= 2
    _compare(plain, static)
    # ending rows early (checks every 4 steps) does not change where they end
    static4 = HFBackend(decode="static", sync_every=4).generate(model, tok, prompts, max_new_tokens=30,
                                                               temperature=temperature, seed=3, stop=stop)
    _compare(plain, static4)


def test_stop_strings_are_matched_in_the_generated_text_only(tok, prompts):
    """The one documented difference from generate: generate's StopStringCriteria also matches a stop
    string that begins in the prompt ("hello there, how" + "w" ends with "ww"); the static path, like
    vLLM, looks at the generated text only."""
    model = _llama(tok)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    assert TEXTS[1].endswith("w") and plain[1].text.startswith("www")
    plain, static = _both(model, tok, prompts, max_new_tokens=30, temperature=0.0, stop=["ww"])
    assert plain[1].text == "w"  # generate stopped after one token, and the row is not seen as stopped
    assert static[1].text == "ww" and static[1].finish_reason == "stop"
    assert [g.ids for i, g in enumerate(plain) if i != 1] == [g.ids for i, g in enumerate(static) if i != 1]


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_short_limits_and_one_token_prompts(tok, max_new):
    model = _llama(tok)
    prompts = [[tok.convert_tokens_to_ids("a")], encode(tok, "12+3="), [tok.convert_tokens_to_ids("7")]]
    for temperature in (0.0, 0.9):
        plain, static = _both(model, tok, prompts, max_new_tokens=max_new, temperature=temperature, seed=2)
        _compare(plain, static)
        assert all(len(g.ids) <= max_new for g in static)


def test_generation_config_min_new_tokens_and_repetition_penalty(tok, prompts):
    model = _llama(tok)
    model.generation_config.min_new_tokens = 6
    model.generation_config.repetition_penalty = 1.4
    for temperature in (0.0, 1.0):
        plain, static = _both(model, tok, prompts, max_new_tokens=20, temperature=temperature, seed=4)
        assert min(len(g.ids) for g in plain) >= 6
        _compare(plain, static)


def test_unsupported_generation_config_is_refused(tok, prompts):
    model = _llama(tok)
    model.generation_config.no_repeat_ngram_size = 3
    with pytest.raises(UserError, match="no_repeat_ngram_size"):
        HFBackend(decode="static").generate(model, tok, prompts, max_new_tokens=4)


def test_unsupported_architecture_is_refused(tok, prompts):
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(UserError, match="decode: generate"):
        HFBackend(decode="static").generate(model, tok, prompts, max_new_tokens=4)


@pytest.mark.parametrize("options,match", [({"decode": "fast"}, "decode"), ({"decode": "static", "graphs": "yes"},
                                                                            "graphs"),
                                           ({"decode": "static", "sampler": "gumbel"}, "sampler"),
                                           ({"decode": "static", "max_cache_mb": -1}, "max_cache_mb"),
                                           ({"decode": "static", "sync_every": 0}, "sync_every"),
                                           ({"decode": "static", "keep_cache": "yes"}, "keep_cache"),
                                           ({"decode": "static", "compact": "auto"}, "compact"),
                                           ({"decode": "static", "merge_lora": "auto"}, "merge_lora"),
                                           ({"decode": "static", "share_prompts": "yes"}, "share_prompts"),
                                           ({"merge_lora": True}, "merge_lora.*needs decode: static"),
                                           ({"decode": "static", "prefix_cache_mb": -1}, "prefix_cache_mb"),
                                           ({"decode": "static", "prefix_cache_mb": True}, "prefix_cache_mb"),
                                           ({"prefix_cache_mb": 64}, "prefix_cache_mb.*needs decode: static"),
                                           ({"decode": "static", "prefix_cache_mb": 64, "compact": True},
                                            "prefix_cache_mb and compact"),
                                           ({"compact": True}, "compact.*needs decode: static")])
def test_bad_options_are_one_line_errors(options, match):
    with pytest.raises(UserError, match=match):
        HFBackend(**options)


def test_cpu_decoding_frees_its_kv_caches_after_each_call(tok, prompts):
    """Without graphs nothing reuses a state, so by default none outlives its call; results are
    those of generate either way (and of a decoder that keeps them)."""
    model = _llama(tok)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=20, temperature=0.0)
    freeing, keeping = HFBackend(decode="static"), HFBackend(decode="static", keep_cache=True)
    for backend in (freeing, keeping):
        _compare(plain, backend.generate(model, tok, prompts, max_new_tokens=20, temperature=0.0))
        _compare(plain, backend.generate(model, tok, prompts[:3], max_new_tokens=20, temperature=0.0)
                 + backend.generate(model, tok, prompts[3:], max_new_tokens=20, temperature=0.0))
    assert not freeing.decoder(model).states
    assert len(keeping.decoder(model).states) == 3  # rows × cache length: the whole list, then its two parts


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-lora"])
@pytest.mark.parametrize("buckets", [False, True])
def test_compacted_rows_give_generates_greedy_results_in_fewer_row_steps(tok, prompts, arch, buckets):
    """On this model and thread count the smaller products round as the full batch's do, so the
    ids are generate's (the option's caveat is about other shapes and machines); the rows a step
    runs on shrink as rows end, also after stop strings and under min_new_tokens and a penalty."""
    model = MODELS[arch](tok)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    lengths = sorted(len(g.ids) for g in plain)
    assert lengths[0] < lengths[-1] == 30, "rows should end at different steps"
    full, compact = HFBackend(decode="static", buckets=buckets), HFBackend(decode="static", buckets=buckets,
                                                                          compact=True)
    _compare(plain, full.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0))
    _compare(plain, compact.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0))
    every, fewer = full.decoder(model).stats, compact.decoder(model).stats
    assert every.row_steps == (16 if buckets else len(prompts)) * (every.steps - 1) and every.compactions == 0
    assert compact.decoder(model).stats.compactions >= 1 and fewer.row_steps < every.row_steps
    assert fewer.row_steps >= sum(lengths) - len(prompts)  # never fewer than the rows still generating
    # against the full static path here: generate also stops on a stop string begun in the prompt
    model.generation_config.min_new_tokens = 3
    model.generation_config.repetition_penalty = 1.3
    penalised = full.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    stop = [max((g.text for g in penalised), key=len)[4:6]]  # ends the longest row, maybe others
    ended = full.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0, stop=stop)
    assert any(g.finish_reason == "stop" and g.ids[-1] != tok.eos_token_id for g in ended)
    _compare(ended, compact.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0, stop=stop))


def test_compacted_sampling_keeps_each_rows_tokens_and_log_probs(tok, prompts):
    """Sampled with compaction, each row's log-probs are those its own ids have under the model."""
    model = _llama(tok)
    backend = HFBackend(decode="static", compact=True)
    gens = backend.generate(model, tok, prompts, max_new_tokens=30, temperature=1.0, seed=7)
    assert backend.decoder(model).stats.compactions >= 1
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    for p, g in zip(prompts, gens):
        with torch.no_grad():
            logits = model(torch.tensor([p + g.ids])).logits[0, len(p) - 1:-1].float()
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


def _all_linear_lora(model, seed: int = 3, **kw):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                                            task_type="CAUSAL_LM", **kw))


def _count_adapter_calls(model) -> list[int]:
    """A counter of forward calls of every LoRA A matrix (peft's unmerged path runs each)."""
    calls = [0]
    for name, module in model.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_merged_lora_gives_generates_greedy_results_without_running_the_adapters(tok, prompts, arch):
    """``merge_lora``: every adapted linear layer (all-linear, q/k/v biases on qwen2) runs as one
    product with W + s·B·A: the adapters' own modules are never called, the ids are generate's
    (on these models the two roundings agree) and the log-probs agree to float32 rounding; the
    model is not modified."""
    model = _all_linear_lora(MODELS[arch](tok))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = _count_adapter_calls(model)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    assert calls[0] > 0
    calls[0] = 0
    merged = HFBackend(decode="static", merge_lora=True)
    _compare(plain, merged.generate(model, tok, prompts, max_new_tokens=30, temperature=0.0), tol=1e-4)
    assert calls[0] == 0, "the merged path should not run the adapters' modules"
    assert len(merged.decoder(model).arch.merged.weights) == 7 * len(merged.decoder(model).arch.layers)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_merged_weights_follow_an_optimiser_step_and_the_active_adapter(tok, prompts):
    """The merged weights are made again at every call: after an optimiser step on the adapters
    (in place) and after switching to another adapter, the decoder gives generate's ids for the
    model as it is then, with the same decoder object."""
    model = _all_linear_lora(_llama(tok))
    backend = HFBackend(decode="static", merge_lora=True)
    first = backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0)
    decoder = backend.decoder(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    ids = torch.tensor([prompts[1] + prompts[4]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    after = backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0)
    assert backend.decoder(model) is decoder
    assert [g.ids for g in after] != [g.ids for g in first], "the update should change greedy outputs"
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=16, temperature=0.0), after, tol=1e-4)
    from peft import LoraConfig

    torch.manual_seed(9)
    model.add_adapter("other", LoraConfig(r=2, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    model.set_adapter("other")
    other = backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0)
    assert [g.ids for g in other] != [g.ids for g in after]
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=16, temperature=0.0), other, tol=1e-4)
    with model.disable_adapter():  # adapters off: the base weights as they are
        _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=16, temperature=0.0),
                 backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0), tol=1e-4)


def test_merge_into_writes_w_plus_delta_into_the_given_tensor(tok):
    """The decoder's fused merge equals peft's W + get_delta_weight, in the tensor it was given."""
    from mlmt_bench.models.lora_weights import lora_layers, merge_into, merged_weight

    model = _all_linear_lora(_llama(tok))
    layers = list(lora_layers(model.get_base_model()).values())
    assert layers
    for layer in layers:
        want = merged_weight(layer, layer.base_layer.weight)
        buf = torch.empty_like(want)
        got = merge_into(layer, buf)
        assert got is buf and torch.allclose(got, want, atol=1e-6)
        assert not torch.equal(got, layer.base_layer.weight)  # init_lora_weights=False: B is not zero
        fresh = merge_into(layer, torch.empty(3))  # a tensor of another shape is not written
        assert fresh.shape == want.shape and torch.allclose(fresh, want, atol=1e-6)


def test_merged_lora_refuses_dora_and_16_bit_products(tok, prompts):
    model = _all_linear_lora(_llama(tok), use_dora=True)
    with pytest.raises(UserError, match="merge_lora cannot merge DoRA"):
        HFBackend(decode="static", merge_lora=True).generate(model, tok, prompts, max_new_tokens=4)
    model = _all_linear_lora(_llama(tok))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(UserError, match="float32 products.*bfloat16"):
        HFBackend(decode="static", merge_lora=True).generate(model, tok, prompts, max_new_tokens=4)
    model.get_base_model().model.layers[0].mlp.up_proj.base_layer.to(torch.bfloat16)  # a frozen weight cast once
    with pytest.raises(UserError, match="float32 products.*bfloat16"):
        HFBackend(decode="static", merge_lora=True).generate(model, tok, prompts, max_new_tokens=4)
    plain = _llama(tok)  # no adapter to merge (a frozen critic): runs under autocast as without the option
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = HFBackend(decode="static").generate(plain, tok, prompts, max_new_tokens=4)
        _compare(want, HFBackend(decode="static", merge_lora=True).generate(plain, tok, prompts, max_new_tokens=4))


def test_graphs_need_cuda(tok, prompts):
    with pytest.raises(UserError, match="CUDA"):
        HFBackend(decode="static", graphs=True).generate(_llama(tok), tok, prompts, max_new_tokens=2)


def test_weights_updated_in_place_are_used_without_rebuilding(tok, prompts):
    """The decoder object (and its KV states) outlive an optimiser step; the next call uses the new weights."""
    model = _llama(tok)
    backend = HFBackend(decode="static", buckets=True, keep_cache=True)
    before = backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0)
    decoder = backend.decoder(model)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    ids = torch.tensor([prompts[1] + prompts[4]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    backend.sync_weights(model)
    after = backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0)
    assert backend.decoder(model) is decoder and decoder.states
    assert [g.ids for g in after] != [g.ids for g in before], "the update should change greedy outputs"
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=16, temperature=0.0), after)
    # a parameter with new storage (not an in-place update) is noticed too
    with torch.no_grad():
        layer = model.model.layers[0].mlp.up_proj
        layer.weight = torch.nn.Parameter(layer.weight.detach().clone() * 1.5)
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=16, temperature=0.0),
             backend.generate(model, tok, prompts, max_new_tokens=16, temperature=0.0))
    backend.close()  # the runner closes the backend at the end of a run: caches and graphs go
    assert not backend.decoders


# ----------------------------------------------------------------------------------------------
# CUDA-graph semantics, on the CPU


class _ReplayedClosure:
    """Stands in for a CUDA graph: ``replay()`` reruns the recorded step with the Python values it
    had at capture, as a graph replays its kernels; only what the step reads from buffers changes."""

    def __init__(self, run):
        self.run = run

    def replay(self):
        self.run()


def _fake_capture_graph(self, prepare, run):
    prepare()
    run()
    return _ReplayedClosure(run)


def _graph_decoder(monkeypatch, model, **kw):
    from mlmt_bench.rollout.static_decode import StaticDecoder

    monkeypatch.setattr(StaticDecoder, "_capture_graph", _fake_capture_graph)
    return StaticDecoder(model, graphs=True, buckets=True, max_cache_mb=None, sync_every=kw.pop("sync_every", 8),
                         sampler="race", max_rows=256, **kw)


def _as_records(decoder, tok, prompts, stop=None, seed=None, **kw):
    from mlmt_bench.rollout.hf_backend import _records
    from mlmt_bench.rollout.stops import StopStrings

    stops = StopStrings(tok, stop) if stop else None
    if seed is not None:
        torch.manual_seed(seed)
    ids, lps = decoder.generate(prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, stops=stops, **kw)
    return _records(ids, lps, tok.eos_token_id, tok.pad_token_id, tok, stops)


def test_replayed_steps_read_every_changing_value_from_buffers(monkeypatch, tok, prompts):
    """Decoding by replaying one recorded step per (state, active length) gives generate's greedy
    rows: nothing that changes from step to step (slot, position, step index, finished rows, cache
    mask) is a Python value baked into the step."""
    model = _llama(tok)
    dec = _graph_decoder(monkeypatch, model)
    plain = HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0)
    _compare(plain, _as_records(dec, tok, prompts, max_new_tokens=30, temperature=0.0, top_p=1.0))
    captured = dec.stats.graphs_captured
    assert captured >= 2 and dec.stats.graph_replays >= 20
    # a second call with other prompts of the same buckets reuses every graph
    other = [p[::-1] for p in prompts]
    _compare(HFBackend().generate(model, tok, other, max_new_tokens=30, temperature=0.0),
             _as_records(dec, tok, other, max_new_tokens=30, temperature=0.0, top_p=1.0))
    assert dec.stats.graphs_captured == captured
    # stop strings end rows between replays (one that cannot begin in the prompt: see the next test)
    text = plain[0].text
    stop = [next(text[i:i + 2] for i in range(1, len(text) - 1) if text[i] != text[i + 1])]
    assert stop[0] not in TEXTS[0] + text[:1]
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=30, temperature=0.0, stop=stop),
             _as_records(dec, tok, prompts, max_new_tokens=30, temperature=0.0, top_p=1.0, stop=stop))


def test_replayed_sampling_steps_match_eager_ones(monkeypatch, tok, prompts):
    """With graphs captured (first call), a seeded call draws exactly what the eager race sampler
    draws: temperature, top-p and the random draws come from buffers and the RNG, not from Python."""
    from mlmt_bench.rollout.static_decode import StaticDecoder

    model = _llama(tok)
    dec = _graph_decoder(monkeypatch, model)
    kw = dict(max_new_tokens=24, temperature=0.8, top_p=0.9)
    _as_records(dec, tok, prompts, **kw)  # captures
    replays = dec.stats.graph_replays
    graphed = _as_records(dec, tok, prompts, seed=7, **kw)
    assert dec.stats.graph_replays > replays
    eager = StaticDecoder(model, graphs=False, buckets=True, max_cache_mb=None, sync_every=8, sampler="race",
                          max_rows=256)
    _compare(_as_records(eager, tok, prompts, seed=7, **kw), graphed)
    # another temperature reuses the same graphs (it is a buffer)
    captured = dec.stats.graphs_captured
    _compare(_as_records(eager, tok, prompts, seed=8, max_new_tokens=24, temperature=1.3, top_p=0.9),
             _as_records(dec, tok, prompts, seed=8, max_new_tokens=24, temperature=1.3, top_p=0.9))
    assert dec.stats.graphs_captured == captured


def test_a_replaced_parameter_drops_the_graphs(monkeypatch, tok, prompts):
    model = _llama(tok)
    dec = _graph_decoder(monkeypatch, model)
    _as_records(dec, tok, prompts, max_new_tokens=12, temperature=0.0, top_p=1.0)
    assert dec._graphs
    with torch.no_grad():  # an in-place update keeps them
        model.model.layers[0].mlp.up_proj.weight.mul_(1.01)
    dec.check_params()
    assert dec._graphs and dec.stats.recaptures == 0
    layer = model.model.layers[0].mlp.up_proj
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())
    dec.check_params()
    assert not dec._graphs and dec.stats.recaptures == 1
    _compare(HFBackend().generate(model, tok, prompts, max_new_tokens=12, temperature=0.0),
             _as_records(dec, tok, prompts, max_new_tokens=12, temperature=0.0, top_p=1.0))


# ----------------------------------------------------------------------------------------------
# the sampling distribution


def _first_token_counts(model, tok, prompt, n, *, temperature, top_p=1.0, seed, sampler):
    """Counts of the first generated token over ``n`` copies of ``prompt`` (the decoder's raw ids:
    Generation records drop a trailing <pad>, which an untrained model sometimes samples)."""
    decoder = HFBackend(decode="static", batch_size=n, sampler=sampler).decoder(model)
    torch.manual_seed(seed)
    ids, _ = decoder.generate([prompt] * n, max_new_tokens=1, temperature=temperature, top_p=top_p,
                              eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    return torch.bincount(ids[:, 0], minlength=len(tok)).double()


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit, pooling the tokens whose expected count is below 5."""
    from scipy.stats import chisquare

    n = counts.sum()
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def _spread_model(tok):
    """A model whose next token after "7*8=" is spread over a few dozen tokens (about 20 above 1 %),
    the prompt, and the model's logits there (float32)."""
    model = build_tiny_model("tiny-0.5m", tok, seed=3)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(1.5)
        prompt = encode(tok, "7*8=")
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    return model, prompt, logits


@pytest.mark.parametrize("sampler", ["multinomial", "race"])
def test_first_token_distribution_follows_the_tempered_softmax(tok, sampler):
    model, prompt, logits = _spread_model(tok)
    temperature = 0.8
    counts = _first_token_counts(model, tok, prompt, 10000, temperature=temperature, seed=0, sampler=sampler)
    probs = torch.softmax(logits / temperature, -1)
    assert (probs > 0.01).sum() >= 10
    assert _chi2_pvalue(counts, probs) > 1e-3
    # the same test rejects the distribution at the wrong temperature
    assert _chi2_pvalue(counts, torch.softmax(logits / 1.0, -1)) < 1e-6


@pytest.mark.parametrize("sampler", ["multinomial", "race"])
def test_top_p_keeps_the_nucleus_and_its_renormalised_weights(tok, sampler):
    model, prompt, logits = _spread_model(tok)
    temperature, top_p = 1.0, 0.7
    probs = torch.softmax(logits / temperature, -1)
    order = torch.argsort(probs, descending=True)
    cum = torch.cumsum(probs[order], 0)
    keep = order[: int((cum < top_p).sum()) + 1]  # the smallest set whose mass reaches top_p
    nucleus = torch.zeros_like(probs)
    nucleus[keep] = probs[keep] / probs[keep].sum()
    assert 3 <= len(keep) < (probs > 1e-4).sum()
    counts = _first_token_counts(model, tok, prompt, 10000, temperature=temperature, top_p=top_p, seed=1,
                                 sampler=sampler)
    outside = torch.ones_like(probs, dtype=torch.bool)
    outside[keep] = False
    assert counts[outside].sum() == 0
    assert _chi2_pvalue(counts[keep], nucleus[keep]) > 1e-3
    # the same test rejects the distribution without top-p
    assert _chi2_pvalue(counts, probs) < 1e-6


# ----------------------------------------------------------------------------------------------
# in the trainer


def _two_mlmt_steps(out, policies: dict, options: dict, algorithm: str = "mlmt", evaluation: dict | None = None):
    """Two steps of ``algorithm`` (mlmt; group 4, 12 new tokens, a parity verifier) of ``policies``
    with the hf backend's ``options``, one thread: the trainer and its train records."""
    from conftest import minimal_spec
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run
    from mlmt_bench.tracking import RunDir
    from support import ParityVerifier

    d = minimal_spec()
    d["output_dir"] = str(out)
    d["policies"] = policies
    d["algorithm"] = {"name": algorithm, "params": {"group_size": 4}}
    d["backend"] = {"max_new_tokens": 12, "options": options}
    d["eval"] = evaluation or {"every": 0, "feedback_metrics": False, "limit": 4}
    spec = validate_run(d, "test")
    runner.configure_torch(spec)
    torch.set_num_threads(1)
    comp = runner.build(spec, progress=False)
    comp.verifier = ParityVerifier()
    run_dir = RunDir.create(spec.output_dir, spec.name, "", spec.seed)
    trainer = runner.make_trainer(spec, comp, run_dir)
    trainer.train(None)
    return trainer, [r for r in run_dir.metrics() if r["kind"] == "train"]


def test_mlmt_training_is_identical_with_the_static_path(tiny_ckpt, tmp_path):
    """Two mlmt steps (solver and critic, attempts, feedback and refinements) with decode: static,
    with and without kept prefixes, give the same rollouts, rewards and losses as with plain
    generate: the CPU sampler draws what generate draws, in-place weight updates reach the next
    step's generation, and the refinements copy the attempts' keys and values."""
    policies = {"solver": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2},
                "critic": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2}}
    paths = {"generate": {"decode": "generate"}, "static": {"decode": "static"},
             "kept": {"decode": "static", "prefix_cache_mb": 64}}
    runs = {name: _two_mlmt_steps(tmp_path / name, policies, options) for name, options in paths.items()}
    records = {name: run[1] for name, run in runs.items()}
    keys = ("gen_tokens", "reward_mean", "loss/solver", "loss/critic", "len/attempt", "len/feedback", "len/refine")
    assert len(records["static"]) == 2
    for name in ("static", "kept"):
        for a, b in zip(records["generate"], records[name]):
            for k in keys:
                assert k in a, k
                assert a[k] == pytest.approx(b[k], abs=1e-6), (name, k)
    assert records["generate"][1]["loss/solver"] != records["generate"][0]["loss/solver"]
    solver = runs["kept"][0].actors.solver.model
    assert runs["kept"][0].actors.backend.decoder(solver).stats.prefix_rows > 0, "refinements should copy attempts"


def test_a_grpo_evaluation_keeps_its_attempts_for_the_base_critics_refinements(tiny_ckpt, tmp_path):
    """grpo's evaluation has no refinements of its own; with ``eval.base_critic`` its attempts are
    kept all the same, and the base critic's pass (and its g∅ refinements) copy them: the same
    evaluation metrics as without kept prefixes."""
    policies = {"solver": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2}}
    evaluation = {"every": 0, "limit": 6, "base_critic": True, "memo": False}
    runs = {mb: _two_mlmt_steps(tmp_path / str(mb), policies, {"decode": "static", "prefix_cache_mb": mb}, "grpo",
                                evaluation) for mb in (0, 64)}
    evals = {}
    for mb, (trainer, _) in runs.items():
        records = [r for r in trainer.run_dir.metrics() if r["kind"] == "eval"]
        evals[mb] = {k: v for k, v in records[-1].items() if k.startswith(("acc", "base_critic/acc"))}
    assert "base_critic/acc@t2" in evals[64] and evals[64] == evals[0]
    trainer = runs[64][0]
    assert trainer.actors.backend.decoder(trainer.actors.solver.model).stats.prefix_rows >= 2 * 6


def test_mlmt_training_on_a_shared_base_is_the_same_with_merged_lora(tiny_ckpt, tmp_path):
    """Two mlmt steps with solver and critic as two adapters of one base (share_base), sampled at
    T 1 on the static path, with and without merge_lora: the same rollouts, rewards and losses
    (the merged products differ in rounding only, below what moves a draw here), so each role's
    decoder merges its own adapter, after every update."""
    lora = {"r": 4, "alpha": 8, "target_modules": "all-linear"}
    policies = {"share_base": True,
                "solver": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2, "lora": lora},
                "critic": {"model": "tiny", "path": str(tiny_ckpt), "lr": 1e-2, "lora": lora}}
    records = {}
    for merge in (False, True):
        trainer, records[merge] = _two_mlmt_steps(tmp_path / str(merge), policies,
                                                  {"decode": "static", "merge_lora": merge})
        backend = trainer.actors.backend
        merged = [dec.arch.merged for dec in backend.decoders.values()]
        assert all((m is not None) == merge for m in merged) and len(merged) == 2
        for role in ("solver", "critic"):  # each role's decoder generates with its adapter as trained
            policy = trainer.policies[role]
            prompts = [encode(policy.tokenizer, t) for t in TEXTS[:3]]
            _compare(HFBackend().generate(policy.model, policy.tokenizer, prompts, max_new_tokens=8),
                     backend.generate(policy.model, policy.tokenizer, prompts, max_new_tokens=8), tol=1e-4)
    keys = ("gen_tokens", "reward_mean", "loss/solver", "loss/critic", "len/attempt", "len/feedback", "len/refine")
    assert len(records[True]) == 2
    for a, b in zip(records[False], records[True]):
        for k in keys:
            assert a[k] == pytest.approx(b[k], abs=1e-5), k
    assert records[True][1]["loss/critic"] != records[True][0]["loss/critic"]


def test_static_decode_runs_under_cpu_bfloat16_autocast(tok, prompts):
    """A run with ``train.cpu_dtype: bfloat16`` generates under autocast: k and v come out of the
    layers in bfloat16 while the static cache holds the weights' float32 (``index_copy_`` refused
    the mix). Widening them is exact; the first token of every row (the prefill, the same
    kernels in both paths) is generate's, and later ones may differ by bfloat16 rounding."""
    model = MODELS["llama-lora"](tok)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, static = _both(model, tok, prompts, max_new_tokens=12, temperature=0.0, seed=0)
    assert len(plain) == len(static) == len(prompts)
    assert [g.ids[:1] for g in static] == [g.ids[:1] for g in plain]
    assert all(len(g.ids) == len(g.logprobs) > 0 for g in static)
