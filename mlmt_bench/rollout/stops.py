"""Stop strings on generated token ids: where a continuation ends because of one.

A continuation stops after the first token at which its decoded text (special tokens kept) ends
with one of the stop strings, the rule of transformers' ``StopStringCriteria`` applied to the
generated tokens. Both generation paths of the ``hf`` backend use it: plain ``generate`` to find
where a padded row ended, the static decoder to end rows early and to cut them.
"""

from __future__ import annotations

from typing import Any


class StopStrings:
    """``StopStrings(tokenizer, ["#", "\\n\\n"])``; ``end(ids)`` is the number of tokens up to and
    including the first completed stop string, or None."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        # a stop string of k characters spans at most k tokens (every token decodes to ≥ 1 character)
        self.max_tokens = max((len(s) for s in self.stop), default=0)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def end(self, ids: list[int]) -> int | None:
        """Tokens up to the end of the first stop string in ``ids``, or None if none completes."""
        if not self.stop or not any(s in self._text(ids) for s in self.stop):
            return None
        for n in range(1, len(ids) + 1):
            text = self._text(ids[:n])
            if any(text.endswith(s) for s in self.stop):
                return n
        return None

    def seen(self, tails: list[list[int]]) -> list[bool]:
        """Whether each tail of ids (the tokens since the last check plus ``max_tokens`` before them)
        contains a stop string: a cheap test for ending rows early; :meth:`end` says where."""
        return [any(s in self._text(t) for s in self.stop) for t in tails]
