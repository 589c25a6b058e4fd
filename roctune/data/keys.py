"""What makes two conversations the same: fixed-size hashes for exact and near duplicates (after ignoring
case, punctuation, symbols and spacing), for prompts and for answers. `data check` and `data split` use them.
"""
from __future__ import annotations

import re

# ASCII punctuation, symbols, whitespace and control bytes (deleted from the UTF-8 bytes in one C pass), then
# the general-punctuation, CJK-punctuation and full-width-punctuation blocks.
_ASCII_NOISE = bytes(range(0, 48)) + bytes(range(58, 65)) + bytes(range(91, 97)) + bytes(range(123, 128))
_UNICODE_PUNCT = re.compile(rb"\xc2[\xa0-\xbf]|\xe2\x80[\x80-\xbf]|\xe2\x81[\x80-\x9e]|\xe3\x80[\x80-\xbf]|"
                            rb"\xef\xbc[\x80-\x8f\x9a-\xa0\xbb-\xbf]|\xef\xbd[\x80\x9b-\xa5]")


def normalise(text: str) -> bytes:
    """What near-duplicates share: the lower-cased text without punctuation, symbols or whitespace (UTF-8).

    Works on bytes with `bytes.translate`, several times faster than a regular expression over the text.
    """
    b = text.lower().encode("utf-8", "surrogatepass").translate(None, _ASCII_NOISE)
    if not b.isascii():
        b = _UNICODE_PUNCT.sub(b"", b)
    return b


def conversation_keys(messages: list[dict[str, str]], images: list = ()) -> tuple[int, int, int, int, bool]:
    """Hashes of one conversation: (exact, near, prompt, answer) and whether the answer repeats the prompt.

    The prompt is every turn before the last assistant turn, the answer that turn (and any after it); each
    part is normalised in one call, its turns joined by U+0080 (kept by `normalise`, absent from real text).
    The record's images (data.images.ImageRef) belong to the prompt: their bytes' hashes join the exact, near and
    prompt keys, so one question about different pictures is neither a repeat nor a conflict.
    """
    roles = tuple(m["role"] for m in messages)
    contents = tuple(m["content"] for m in messages)
    last = len(roles) - 1 - roles[::-1].index("assistant")
    prompt_n = normalise("\x80".join(contents[:last]))
    answer_n = normalise(contents[last]) if last == len(roles) - 1 else normalise("\x80".join(contents[last:]))
    pictures = tuple(ref.content_hash() for ref in images)
    exact = hash((roles, contents, pictures))
    near = hash((roles, prompt_n, answer_n, pictures))
    prompt = hash((roles[:last], prompt_n, pictures))
    answer = hash((roles[last:], answer_n))
    echo = False
    if answer_n and answer_n in prompt_n:  # cheap test first; most answers are not in their prompt
        lu = last - 1
        while lu >= 0 and roles[lu] != "user":
            lu -= 1
        if lu >= 0:
            echo = (prompt_n if last == 1 else normalise(contents[lu])) == answer_n
    return exact, near, prompt, answer, echo
