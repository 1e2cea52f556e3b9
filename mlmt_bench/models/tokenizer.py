"""A character-level tokenizer for the tiny policies, built locally (no downloads).

Every printable ASCII character, space, tab and newline is one token; the special tokens are
``<pad>``, ``<unk>``, ``<|user|>``, ``<|assistant|>`` and ``<|end|>`` (the EOS token). No BOS is
ever added. The chat template renders each message as ``<|{role}|>{content}<|end|>`` and the
generation prompt as ``<|assistant|>``; there is no system prompt (a system message is an error).

Because every character is its own token and the special tokens are split out before the
model sees the text, tokenisation is *compositional*:

- the ids of a rendered conversation are the concatenation of the ids of each message
  rendered alone, and
- ``render([user]) + <|assistant|>`` followed by ``ids(content) + [eos]`` equals the ids of
  ``render([user, assistant(content)])``, i.e. what a model emits after ``<|assistant|>`` is
  exactly the assistant message.

This is what token-in/token-out rollouts rely on (ARCHITECTURE.md, Principles).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

PAD = "<pad>"
UNK = "<unk>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, USER, ASSISTANT, END)

#: Every character the tokenizer knows (besides the special tokens), in id order.
CHARACTERS: str = "\n\t" + "".join(chr(c) for c in range(32, 127))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('this chat template has roles user and assistant only, got ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(extra_chars: Iterable[str] = ()) -> Any:
    """A ``PreTrainedTokenizerFast`` over single characters (see the module docstring).

    ``extra_chars``: characters to add beyond printable ASCII (e.g. a benchmark's non-ASCII
    symbols); they get ids after the built-in ones, so the ids of the base set never move.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = list(CHARACTERS)
    for c in extra_chars:
        for ch in c:
            if ch not in chars:
                chars.append(ch)
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    # BPE with no merges = one token per character; unknown characters map to <unk>.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=END,
        bos_token=None,
        additional_special_tokens=[USER, ASSISTANT],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer: Any, directory: str | Path) -> Path:
    """Write ``tokenizer`` so that ``AutoTokenizer.from_pretrained(directory)`` loads it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of plain text, with no special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
