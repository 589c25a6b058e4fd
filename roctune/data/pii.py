"""Personal data in text: what counts as an e-mail, ID card, bank card, mobile or landline number or IPv4
address, and `Scrubber`, which replaces each with a typed placeholder.

Each type is a regular expression for candidates plus a validator, so look-alikes stay: an 18-digit number
must carry a valid GB 11643-1999 check digit (and a real region and birth date) to be an ID card, a card
number must pass the Luhn check, a mobile number must be a whole number starting 13-19, an IPv4 address
must have four octets 0-255 and not be part of a version string. Numbers glued to letters or other digits
(order numbers, hashes, timestamps) never match because every pattern requires a boundary on both sides.
Full-width digits (０-９) are read as the digits they stand for, full-width letters as letters.
"""
from __future__ import annotations

import datetime
import re
from collections import Counter
from typing import Any

from roctune.errors import ConfigError

PLACEHOLDERS = {
    "email": "<EMAIL>",
    "id_card": "<ID_CARD>",
    "bank_card": "<BANK_CARD>",
    "phone": "<PHONE>",
    "landline": "<LANDLINE>",
    "ip": "<IP>",
}
TYPES = tuple(PLACEHOLDERS)
# what each type is, in words (the web UI's labels; its Chinese is beside the page's other texts)
LABELS = {
    "email": "e-mail addresses",
    "id_card": "ID card numbers (China)",
    "bank_card": "bank card numbers",
    "phone": "mobile phone numbers",
    "landline": "landline phone numbers",
    "ip": "IPv4 addresses",
}

# Every pattern starts with a character class (so the regex engine jumps between candidates in C) and then
# checks with a fixed-width lookbehind that no letter, digit, '_', '.' or '+' came right before it; the
# lookahead _R rejects a letter, digit or '_' right after, and a decimal part.
_X = r"[0-9A-Za-z_.+]"
_R = r"(?![0-9A-Za-z_]|\.[0-9])"
_EMAIL = re.compile(r"[A-Za-z0-9](?<![A-Za-z0-9._%+-][A-Za-z0-9])[A-Za-z0-9._%+-]*"  # local part
                    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"  # first domain label
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")
# Landline local number, 7 or 8 digits (or grouped 3+4 or 4+4 with a space), optional extension.
_LOCAL = r"(?:[2-9][0-9]{6,7}|[2-9][0-9]{2,3} [0-9]{4})(?:-[0-9]{1,5})?"
# Area codes as dialled from abroad (+86), without the leading 0: 10, 2X, then three digits from 3XX.
_AREA_INTL = r"(?:10|2[0-9]|[3-9][0-9]{2})"
# One pass finds every numeric candidate (IP addresses included); the named group says which shape
# matched, the validators decide.
_NUMBER = re.compile(
    r"[0-9+(](?<!" + _X + r".)(?:"
    r"(?P<id>(?<=[0-9])[0-9]{14}(?:[0-9][0-9][0-9Xx])?" + _R + r")"
    r"|(?P<bank>(?<=[2-6])[0-9]{3}(?:[ -][0-9]{4}){3}[ -][0-9]{1,3}" + _R
    + r"|(?<=[2-6])[0-9]{3}(?:[ -]?[0-9]{4}){2}[ -]?[0-9]{4,7}" + _R + r")"
    r"|(?P<phone>(?:(?<=\+)86|(?<=0)086|(?<=8)6)[ -]?1[3-9][0-9](?:[ -]?[0-9]{4}){2}" + _R
    + r"|(?<=1)[3-9][0-9](?:[ -]?[0-9]{4}){2}" + _R + r")"
    r"|(?P<ip>(?<=[0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}" + _R + r")"
    r"|(?P<landline>(?:(?<=\+)86[ -]?(?:\((?:0[0-9]{2,3}|" + _AREA_INTL + r")\)[ -]?"
    r"|(?:0[0-9]{2,3}|" + _AREA_INTL + r")[- ])"
    r"|(?<=\()0[0-9]{2,3}\)[ -]?|(?<=0)[0-9]{2,3}[- ])"
    + _LOCAL + _R + r")"
    r")")
_PHONE_15 = re.compile(r"00861[3-9][0-9]{9}")
# Cheap tests (each starts with a class, so the engine scans in C) that a string may hold something at all:
# 7 digits in a row, a grouped number or the start of an IP address.
_HINT = re.compile(r"[0-9](?:[0-9]{6}|[ -][0-9]{4}|\)[0-9]|\.[0-9]{1,3}\.[0-9])")
# The same on a raw JSON Lines line; `line_may_match` adds '@' (e-mail), '\u' (an escape could hide
# anything) and any full-width digit (UTF-8 EF BC 90-99; a separate pattern keeps both fast).
LINE_HINT = re.compile(rb"[0-9](?:[0-9]{6}|[ -][0-9]{4}|\)[0-9]|\.[0-9]{1,3}\.[0-9])")
_LINE_FULLWIDTH_DIGIT = re.compile(rb"\xef\xbc[\x90-\x99]")
_VERSION_BEFORE = re.compile(r"(?:\b(?:v|ver|version|release|build|rev)|版本|版本号)[\s:：=]*$", re.IGNORECASE)
_FULLWIDTH_DIGIT = re.compile("[\uff10-\uff19]")
# Full-width digits and letters as ASCII, one character for one (letters too, so that they still count as
# the letters a number must not be glued to).
_FROM_FULLWIDTH = {0xFF10 + i: 0x30 + i for i in range(10)}
_FROM_FULLWIDTH.update({0xFF21 + i: 0x41 + i for i in range(26)})
_FROM_FULLWIDTH.update({0xFF41 + i: 0x61 + i for i in range(26)})

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_PROVINCES = {11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46, 50, 51, 52,
              53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83}


def _valid_date(year: int, month: int, day: int) -> bool:
    try:
        d = datetime.date(year, month, day)
    except ValueError:
        return False
    return d <= datetime.date.today()


def id_card_shape(digits: str) -> bool:
    """A real region code and birth date (what a number needs to look like an ID card at all)."""
    if int(digits[:2]) not in _PROVINCES:
        return False
    if len(digits) == 18:
        return 1900 <= int(digits[6:10]) and _valid_date(int(digits[6:10]), int(digits[10:12]), int(digits[12:14]))
    return _valid_date(1900 + int(digits[6:8]), int(digits[8:10]), int(digits[10:12]))


def id_card_valid(number: str) -> bool:
    """A mainland resident ID: 18 characters with the GB 11643-1999 check digit, or the 15-digit legacy form."""
    number = number.upper()
    if len(number) == 15:
        return number.isdigit() and id_card_shape(number)
    if len(number) != 18 or not number[:17].isdigit() or not id_card_shape(number):
        return False
    total = sum(int(c) * w for c, w in zip(number[:17], _ID_WEIGHTS))
    return _ID_CHECK[total % 11] == number[17]


def luhn_valid(digits: str) -> bool:
    """The Luhn check digit of card numbers (ASCII digits)."""
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def bank_card_valid(number: str) -> bool:
    """16-19 digits (spaces or dashes between groups allowed) with a card prefix and a valid Luhn digit."""
    digits = number.replace(" ", "").replace("-", "")
    if not 16 <= len(digits) <= 19:
        return False
    if digits[0] == "2" and not 2221 <= int(digits[:4]) <= 2720:  # only the Mastercard 2-series starts with 2
        return False
    if not luhn_valid(digits):
        return False
    # An 18-digit number shaped like an ID card but with a wrong check digit is not a card number either.
    return not (len(digits) == 18 and id_card_shape(digits))


class Scrubber:
    """Redacts the chosen types in strings; counts what it replaced in `counts`."""

    def __init__(self, types: list[str] | tuple[str, ...] | None = None):
        types = list(types or TYPES)
        unknown = [t for t in types if t not in PLACEHOLDERS]
        if unknown:
            raise ConfigError(f"--types: unknown type {unknown[0]!r}; choose from {', '.join(TYPES)}")
        self.types = set(types)
        self._numbers = bool(self.types & {"id_card", "bank_card", "phone", "landline", "ip"})
        self.counts: Counter[str] = Counter()

    def _classify(self, m: re.Match) -> tuple[str, int] | None:
        """The type to redact for the numeric candidate `m` and where the redacted part ends, or None."""
        text, kind = m.group(0), m.lastgroup
        if kind == "id":
            if "id_card" in self.types and id_card_valid(text):
                return "id_card", m.end()
            if len(text) == 18 and "bank_card" in self.types and bank_card_valid(text):
                return "bank_card", m.end()
            if "phone" in self.types and _PHONE_15.fullmatch(text):  # 0086 and a mobile number
                return "phone", m.end()
            return None
        if kind == "bank":
            if "bank_card" not in self.types:
                return None
            sep = text[4] if text[4] in " -" else ""
            if sep and text.count(sep) == 4:  # 4-4-4-4 then a short group: prefer the 16-digit reading
                head = text.rpartition(sep)[0]
                if bank_card_valid(head):
                    return "bank_card", m.start() + len(head)
            return ("bank_card", m.end()) if bank_card_valid(text) else None
        if kind == "ip":
            return ("ip", m.end()) if "ip" in self.types and self._is_ip(m) else None
        return (kind, m.end()) if kind in self.types else None

    def _is_ip(self, m: re.Match) -> bool:
        text, start = m.group(0), m.start()
        if any(len(o) > 1 and o[0] == "0" or int(o) > 255 for o in text.split(".")):
            return False
        return not _VERSION_BEFORE.search(m.string, max(0, start - 12), start)

    def _hit(self, kind: str) -> str:
        self.counts[kind] += 1
        return PLACEHOLDERS[kind]

    def _redact_numbers(self, s: str, plain: str) -> str:
        """`s` with every numeric match replaced, matched in `plain`: `s` with its full-width characters as
        ASCII (one for one, so positions agree); the text that stays keeps its own characters."""
        parts: list[str] = []
        last = 0
        for m in _NUMBER.finditer(plain):
            hit = self._classify(m)
            if hit is not None:
                parts += (s[last:m.start()], self._hit(hit[0]))
                last = hit[1]
        if not parts:
            return s
        parts.append(s[last:])
        return "".join(parts)

    def text(self, s: str) -> str:
        """`s` with every match replaced by its placeholder."""
        if "@" in s and "email" in self.types:
            s = _EMAIL.sub(lambda m: self._hit("email"), s)
        if self._numbers and len(s) >= 7:
            plain = s if s.isascii() or not _FULLWIDTH_DIGIT.search(s) else s.translate(_FROM_FULLWIDTH)
            if _HINT.search(plain):
                s = self._redact_numbers(s, plain)
        return s

    def value(self, v: Any) -> tuple[Any, bool]:
        """A JSON-like value with every string inside redacted (keys and non-text values untouched)."""
        if isinstance(v, str):
            new = self.text(v)
            return new, new != v
        if isinstance(v, dict):
            changed = False
            out = {}
            for k, x in v.items():
                out[k], c = self.value(x)
                changed |= c
            return (out, True) if changed else (v, False)
        if isinstance(v, list):
            changed = False
            out_list = []
            for x in v:
                y, c = self.value(x)
                out_list.append(y)
                changed |= c
            return (out_list, True) if changed else (v, False)
        return v, False


def line_may_match(line: bytes) -> bool:
    """Whether a raw JSON Lines line may hold anything to redact (most lines are copied without parsing)."""
    return (b"@" in line or b"\\u" in line or LINE_HINT.search(line) is not None
            or _LINE_FULLWIDTH_DIGIT.search(line) is not None)
