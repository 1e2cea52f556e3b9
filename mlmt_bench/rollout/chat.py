"""Prompt token ids from the chat template, rendered once and extended token-in/token-out."""

from __future__ import annotations

from typing import Any

from mlmt_bench.errors import UserError


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (nothing added
    beyond what the template writes)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True, return_dict=False)
    if isinstance(out, dict) or hasattr(out, "keys"):  # some tokenizers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def _prefix_stable(short: list[int], long: list[int]) -> None:
    if long[:len(short)] != short:
        raise UserError("the chat template is not prefix-stable (rendering a conversation's start is not a prefix "
                        "of rendering the whole): multi-turn token-in/token-out needs it")


def after_turn_ids(tokenizer: Any, history: list[dict[str, str]]) -> list[int]:
    """The ids the template writes after the end-of-turn token of ``history``'s last message, an
    assistant turn: ChatML (SmolLM2, Qwen) ``"\\n"``, the tiny tokenizer's template nothing.

    Read from the template itself: ``history`` rendered with its assistant turn, minus the rest
    rendered with a generation prompt, is the turn (content, end-of-turn, what follows); what
    follows the turn's last EOS (the token generation stops on) is the answer.
    """
    prompt = chat_ids(tokenizer, history[:-1], add_generation_prompt=True)
    closed = chat_ids(tokenizer, history, add_generation_prompt=False)
    _prefix_stable(prompt, closed)
    turn = closed[len(prompt):]
    eos = tokenizer.eos_token_id
    if eos is None or eos not in turn:
        raise UserError("the chat template does not end an assistant turn with the tokenizer's EOS token "
                        f"({tokenizer.eos_token!r}), the token generation stops on: multi-turn token-in/token-out "
                        "cannot tell where a generated turn ends")
    return turn[len(turn) - turn[::-1].index(eos):]


def continuation_ids(tokenizer: Any, history: list[dict[str, str]], new: list[dict[str, str]]) -> list[int]:
    """Ids that follow ``history`` kept as the exact ids generated, when ``new`` messages (then a
    generation prompt) follow it: ``ids(history, its last turn closed by EOS) + continuation_ids``
    is the template's rendering of ``history + new`` with a generation prompt.

    When ``history`` ends with an assistant turn, the continuation starts with what the template
    writes after that turn's end-of-turn token (:func:`after_turn_ids`; ChatML: a newline). The
    template must be prefix-stable (rendering a prefix of the conversation is a prefix of
    rendering the whole: the tiny tokenizer's, ChatML); a one-line error otherwise.
    """
    before = chat_ids(tokenizer, history, add_generation_prompt=False)
    after = chat_ids(tokenizer, history + new, add_generation_prompt=True)
    _prefix_stable(before, after)
    tail = after_turn_ids(tokenizer, history) if history and history[-1]["role"] == "assistant" else []
    return tail + after[len(before):]


def close_turn(tokenizer: Any, ids: list[int]) -> list[int]:
    """A generated turn as context: ids as generated, plus EOS if generation hit the length limit
    (what the template writes after the EOS comes with :func:`continuation_ids`)."""
    eos = tokenizer.eos_token_id
    return ids if (ids and ids[-1] == eos) or eos is None else ids + [eos]
