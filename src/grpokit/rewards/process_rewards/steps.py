"""Steps of a completion: where each reasoning step ends, in characters and in tokens.

A *step* is the text between two delimiters (default ``"\\n"``: one step per line; or a step tag such as
``"<step>"`` or Math-Shepherd's ``"ки"`` written after every step). Rules, shared by every part of grpokit
that talks about steps (verifiers, process reward models, reward-model training, advantages):

- ``split_steps`` returns the character span ``(start, end)`` of each step's *text*, delimiter excluded, so
  ``completion[start:end]`` is what a verifier sees.
- Empty or whitespace-only steps (two delimiters in a row, a leading or a trailing delimiter) are skipped:
  they are not steps and get no reward.
- A completion truncated mid-step still has that partial last step; it ends at the completion's last
  character.
- The *end* of a step, used to place its reward on a token, is the last character of the step's delimiter
  when one follows it (the newline ending a line, the step tag), else the step's own last character. So the
  token that closes a step carries its reward, a process reward model is read at the position where the
  step is complete, and a truncated last step ends at the last token.

``step_token_ends`` maps those end characters to token indices within the completion's token ids, which is
the ``step_ends`` argument of ``grpokit.core.process_advantages``. A step that ends in the middle of a token
ends at that token; two steps that end inside the same token both end there (the list is non-decreasing,
not necessarily strictly increasing).
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DEFAULT_STEP_DELIMITER",
    "char_to_token_index",
    "split_steps",
    "step_char_ends",
    "step_texts",
    "step_token_ends",
    "token_char_ends",
]

DEFAULT_STEP_DELIMITER = "\n"


def _check_delimiter(delimiter: str) -> None:
    if not isinstance(delimiter, str) or delimiter == "":
        raise ValueError(f"step delimiter must be a non-empty string, got {delimiter!r}")


def _spans_and_ends(completion: str, delimiter: str) -> tuple[list[tuple[int, int]], list[int]]:
    """Step spans (delimiter excluded) and step end offsets (exclusive, delimiter included when present)."""
    _check_delimiter(delimiter)
    spans: list[tuple[int, int]] = []
    ends: list[int] = []
    start = 0
    n = len(completion)
    while start <= n:
        cut = completion.find(delimiter, start)
        stop = n if cut < 0 else cut
        if completion[start:stop].strip():
            spans.append((start, stop))
            ends.append(n if cut < 0 else cut + len(delimiter))
        if cut < 0:
            break
        start = cut + len(delimiter)
    return spans, ends


def split_steps(completion: str, delimiter: str = DEFAULT_STEP_DELIMITER) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the non-empty steps of ``completion``, delimiter excluded.

    >>> split_steps("1+2=3\\n\\n3*2=6\\n")
    [(0, 5), (7, 12)]
    """
    return _spans_and_ends(completion, delimiter)[0]


def step_texts(completion: str, delimiter: str = DEFAULT_STEP_DELIMITER) -> list[str]:
    """The text of each step (what a step verifier receives)."""
    return [completion[s:e] for s, e in split_steps(completion, delimiter)]


def step_char_ends(completion: str, delimiter: str = DEFAULT_STEP_DELIMITER) -> list[int]:
    """Exclusive end offset of each step including its delimiter when one follows (see module docstring)."""
    return _spans_and_ends(completion, delimiter)[1]


# ---------------------------------------------------------------------------------------------------------
# token <-> character alignment


def _special_ids(tokenizer: Any) -> set[int]:
    return set(getattr(tokenizer, "all_special_ids", None) or [])


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _ends_from_offsets(tokenizer: Any, text: str, content_ids: list[int]) -> list[int] | None:
    """Token end offsets from a fast tokenizer's offsets, if re-encoding ``text`` gives the same ids."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (TypeError, ValueError, NotImplementedError):
        return None
    if list(enc["input_ids"]) != content_ids:
        return None
    ends, running = [], 0
    for start, end in enc["offset_mapping"]:
        if end <= start:  # trimmed offsets (a whitespace-only token) hide where the token ends
            return None
        running = max(running, int(end))
        ends.append(running)
    return ends if ends and ends[-1] == len(text) else None


def _ends_from_pieces(tokenizer: Any, text: str, content_ids: list[int]) -> list[int] | None:
    """Decode token by token and accumulate lengths; valid only if the pieces concatenate to ``text``."""
    pieces = [_decode(tokenizer, [i]) for i in content_ids]
    if "".join(pieces) != text:
        return None
    ends, running = [], 0
    for piece in pieces:
        running += len(piece)
        ends.append(running)
    return ends


def _ends_from_windows(
    tokenizer: Any, text: str, content_ids: list[int], window: int = 8
) -> list[int] | None:
    """Incremental detokenization: the characters token k adds are ``decode(ids[k-w : k+1])`` minus
    ``decode(ids[k-w : k])``, so decoder context (SentencePiece's leading-space rule, byte-level characters
    split over several tokens, shown as U+FFFD until complete) cancels out. Linear time; valid only if the
    lengths add up to ``text``."""
    ends, running = [], 0
    for k in range(len(content_ids)):
        start = max(0, k - window)
        before = _decode(tokenizer, content_ids[start:k]) if k > start else ""
        after = _decode(tokenizer, content_ids[start : k + 1])
        if k < len(content_ids) - 1:
            before, after = before.rstrip("\ufffd"), after.rstrip("\ufffd")
        running = max(running, running + len(after) - len(before))
        ends.append(running)
    return ends if ends and ends[-1] == len(text) else None


def _ends_from_prefixes(tokenizer: Any, text: str, content_ids: list[int]) -> list[int]:
    """Exact for any tokenizer whose decoding of a prefix is a prefix of the text (quadratic; last resort).

    Byte-level BPE can split one character over several tokens: the partial character decodes to U+FFFD,
    so a prefix that does not end on a character boundary is credited only with its complete characters.
    """
    ends, running = [], 0
    for k in range(1, len(content_ids) + 1):
        prefix = _decode(tokenizer, content_ids[:k])
        length = len(prefix.rstrip("\ufffd")) if k < len(content_ids) else len(prefix)
        running = max(running, min(length, len(text)))
        ends.append(running)
    return ends


def token_char_ends(text: str, completion_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """For each token of ``completion_ids``, the exclusive end offset in ``text`` of the characters it covers.

    ``text`` is the decoding of ``completion_ids`` (special tokens skipped). Special tokens (EOS, padding)
    cover no characters: they get the end of the token before them. Four methods, cheapest first, each
    used only if it reproduces ``text``: the fast tokenizer's offsets (re-encoding ``text`` gives back the
    sampled ids), token-by-token decoding, incremental decoding over a short window, decoding every prefix
    (quadratic, last resort).
    """
    ids = [int(i) for i in completion_ids]
    special = _special_ids(tokenizer)
    content_pos = [k for k, i in enumerate(ids) if i not in special]
    content_ids = [ids[k] for k in content_pos]
    content_ends = (
        (
            _ends_from_offsets(tokenizer, text, content_ids)
            or _ends_from_pieces(tokenizer, text, content_ids)
            or _ends_from_windows(tokenizer, text, content_ids)
            or _ends_from_prefixes(tokenizer, text, content_ids)
        )
        if content_ids
        else []
    )
    ends, running, j = [], 0, 0
    for k in range(len(ids)):
        if j < len(content_pos) and content_pos[j] == k:
            running = max(running, content_ends[j])
            j += 1
        ends.append(running)
    return ends


def char_to_token_index(token_ends: Sequence[int], end: int) -> int:
    """Index of the token that covers character ``end - 1`` (the first token whose end reaches ``end``).

    Ends past the last covered character map to the last token that covers any character (never to a
    trailing EOS); with no tokens at all the answer is -1.
    """
    if not token_ends:
        return -1
    k = bisect.bisect_left(token_ends, end)
    if k >= len(token_ends):
        k = bisect.bisect_left(token_ends, token_ends[-1])  # first token reaching the final offset
    return k


def _align(source: str, target: str) -> list[int]:
    """Map each exclusive end offset 0..len(source) in ``source`` to the matching offset in ``target``."""
    mapping = [0] * (len(source) + 1)
    matcher = difflib.SequenceMatcher(None, source, target, autojunk=False)
    last_s, last_t = 0, 0
    for s, t, size in matcher.get_matching_blocks():
        for k in range(last_s + 1, s + 1):  # unmatched source characters: stay at the last matched target end
            mapping[k] = last_t
        for k in range(1, size + 1):
            mapping[s + k] = t + k
        last_s, last_t = s + size, t + size
    for k in range(last_s + 1, len(source) + 1):
        mapping[k] = last_t
    return mapping


def step_token_ends(
    completion_text: str,
    completion_ids: Sequence[int],
    tokenizer: Any,
    delimiter: str = DEFAULT_STEP_DELIMITER,
) -> list[int]:
    """Index within ``completion_ids`` of the token that ends each step of ``completion_text``.

    One entry per step of ``split_steps(completion_text, delimiter)``; entries are non-decreasing and lie in
    ``[0, len(completion_ids))``. ``completion_text`` should be the decoding of ``completion_ids`` with
    special tokens skipped; if it differs (stripped whitespace, a chat wrapper removed), characters are
    aligned to the decoding with a diff, so a step still ends at the token holding its last character.
    """
    char_ends = step_char_ends(completion_text, delimiter)
    if not char_ends:
        return []
    ids = list(completion_ids)
    if not ids:
        raise ValueError("completion has steps but no token ids")
    decoded = _decode(tokenizer, ids)
    token_ends = token_char_ends(decoded, ids, tokenizer)
    if decoded != completion_text:
        mapping = _align(completion_text, decoded)
        char_ends = [mapping[e] for e in char_ends]
    out = [max(char_to_token_index(token_ends, e), 0) for e in char_ends]
    for j in range(1, len(out)):  # alignment can only make ends equal, never decrease; keep the invariant
        out[j] = max(out[j], out[j - 1])
    return out
