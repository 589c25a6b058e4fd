"""Sentences the library says that a page may show in another language: a `Text` is the English sentence (what
the CLI prints and the JSON report holds, an ordinary str) that also remembers its template and the values put
into it, so a front end can say it in its own language from a catalog keyed by the English template (`say`).
Values that are Texts themselves are said in that language too; plain str values are names (a GPU, a path, a
version, a command) and stay as they are.

Why not gettext: the library speaks English wherever it prints (CLI, logs, JSON), and only the web page asks for
another language, per request; a catalog lookup at the page is all it needs, and the English sentence stays the
key a user would search for."""
from __future__ import annotations


class Text(str):
    """`template.format(**values)`, remembering both. `Text.join` joins Texts with a separator that is said in
    the page's language too."""

    template: str
    values: dict
    sep: str | None = None

    def __new__(cls, template: str, **values):
        self = super().__new__(cls, template.format(**values) if values else template)
        self.template, self.values = template, values
        return self

    @classmethod
    def join(cls, sep: str, items) -> "Text":
        """`sep.join(items)` as a Text: each item and the separator are said in the page's language."""
        items = list(items)
        out = cls(sep.join("{i%d}" % k for k in range(len(items))), **{f"i{k}": v for k, v in enumerate(items)})
        out.sep = sep
        return out


def say(text, catalog: dict[str, str], plain=None, literal=None) -> str:
    """`text` in the language of `catalog` (English template -> template): its template and every Text value
    looked up there; what the catalog lacks stays English. `plain` renders a plain value (a name; default: as it
    is) and `literal` a template's own words (default: as they are): an HTML page passes functions that escape
    them and mark names as code."""
    plain = plain or (lambda v: "" if v is None else str(v))
    literal = literal or (lambda words: words)
    if not isinstance(text, Text):
        return plain(text)
    values = {k: say(v, catalog, plain, literal) for k, v in text.values.items()}
    if text.sep is not None:
        return literal(catalog.get(text.sep, text.sep)).join(values[f"i{k}"] for k in range(len(values)))
    template = literal(catalog.get(text.template, text.template))
    return template.format(**values) if values else template


def templates_of(text) -> list[str]:
    """Every template in `text` and in the Texts inside it (what a catalog must hold to say it all)."""
    if not isinstance(text, Text):
        return []
    own = [] if text.sep is not None else [text.template]
    return own + [t for v in text.values.values() for t in templates_of(v)]
