"""Prompt token ids from the chat template, rendered once and extended token-in/token-out."""

from __future__ import annotations

from typing import Any


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (nothing added
    beyond what the template writes)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True, return_dict=False)
    if isinstance(out, dict) or hasattr(out, "keys"):  # some tokenizers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def continuation_ids(tokenizer: Any, history: list[dict[str, str]], new: list[dict[str, str]]) -> list[int]:
    """Ids that the template adds when ``new`` messages (then a generation prompt) follow ``history``.

    The conversation so far is kept as the exact ids generated; only the new messages are
    rendered. For templates whose rendering of a prefix is a prefix of the whole (the tiny
    tokenizer's, ChatML), this equals rendering the whole conversation at once.
    """
    before = chat_ids(tokenizer, history, add_generation_prompt=False)
    after = chat_ids(tokenizer, history + new, add_generation_prompt=True)
    if after[:len(before)] != before:
        raise ValueError("chat template is not prefix-stable; multi-turn token-in/token-out needs it")
    return after[len(before):]


def close_turn(tokenizer: Any, ids: list[int]) -> list[int]:
    """A generated turn as context: ids as generated, plus EOS if generation hit the length limit."""
    eos = tokenizer.eos_token_id
    return ids if (ids and ids[-1] == eos) or eos is None else ids + [eos]
