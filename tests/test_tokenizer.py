"""The character-level tokenizer: round trips and the chat template's compositional ids."""

from __future__ import annotations

import random

import pytest

from mlmt_bench.benchmarks.synthetic import SyntheticArith
from mlmt_bench.models.tokenizer import CHARACTERS, build_char_tokenizer, encode, load_tokenizer
from mlmt_bench.rollout.chat import chat_ids


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _emitted_texts() -> list[str]:
    """Every kind of text the synthetic benchmark and its prompts emit."""
    texts = [CHARACTERS]
    for ops in ("+-", "+-*"):
        bench = SyntheticArith(ops=ops, n_train=200, n_validation=20, n_test=20)
        t = bench.templates
        rng = random.Random(0)
        for p in bench.load("train") + bench.load("test"):
            gold = bench.solution(p)
            wrong = bench.inject_errors(gold, rng)
            for attempt in (gold, wrong):
                fb = bench.oracle_feedback(p, attempt)
                texts += [t.render_attempt(p), attempt, fb, t.render_feedback(p, attempt), t.render_refine(fb),
                          bench.apply_feedback(p, attempt, fb, revision=True)]
        texts.append(t.null_feedback)
    return texts


def test_round_trip_of_everything_the_benchmark_emits(tok):
    unk = tok.unk_token_id
    for text in _emitted_texts():
        ids = encode(tok, text)
        assert len(ids) == len(text), text  # one token per character
        assert unk not in ids, text
        assert tok.decode(ids) == text
    assert set("".join(_emitted_texts())) <= set(CHARACTERS)


def test_special_tokens(tok):
    assert tok.bos_token is None and tok.eos_token == "<|end|>" and tok.pad_token == "<pad>"
    assert encode(tok, "<|user|>1+2<|end|>") == [tok.convert_tokens_to_ids("<|user|>"), *encode(tok, "1+2"),
                                                tok.eos_token_id]
    assert encode(tok, "é")[0] == tok.unk_token_id
    assert tok.decode(encode(tok, "<|assistant|>#3<|end|>"), skip_special_tokens=True) == "#3"


def test_chat_template_is_compositional(tok):
    conv = [
        {"role": "user", "content": "7+5*3-4"},
        {"role": "assistant", "content": "7+5=12;12*3=35;35-4=31;#31"},
        {"role": "user", "content": "feedback: ok;wrong: 12*3=36"},
        {"role": "assistant", "content": "12*3=36;36-4=32;#32"},
    ]
    whole = chat_ids(tok, conv)
    assert whole == [i for m in conv for i in chat_ids(tok, [m])]
    assert (tok.apply_chat_template(conv, tokenize=False)
            == "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in conv))
    # What a model emits after <|assistant|> is the message's content ids then EOS.
    for k in (1, 3):
        prompt = chat_ids(tok, conv[:k], add_generation_prompt=True)
        assert prompt[-1] == tok.convert_tokens_to_ids("<|assistant|>")
        assert prompt + encode(tok, conv[k]["content"]) + [tok.eos_token_id] == chat_ids(tok, conv[: k + 1])
    assert whole[0] == tok.convert_tokens_to_ids("<|user|>")  # no BOS, no system prompt


def test_system_role_is_refused(tok):
    with pytest.raises(Exception, match="roles user and assistant only"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_save_and_load_with_auto_tokenizer(tok, tmp_path):
    tok.save_pretrained(str(tmp_path))
    again = load_tokenizer(tmp_path)
    conv = [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "1+2=3;#3"}]
    assert chat_ids(again, conv) == chat_ids(tok, conv)
    assert chat_ids(again, conv[:1], add_generation_prompt=True) == chat_ids(tok, conv[:1], add_generation_prompt=True)
    assert (again.eos_token_id, again.pad_token_id, again.bos_token_id, len(again)) == \
        (tok.eos_token_id, tok.pad_token_id, None, len(tok))
    text = "".join(_emitted_texts()[:50])
    assert again.decode(encode(again, text)) == text
