"""Constrained decoding: an answer that must follow a JSON schema (`response_format`) or must be a tool call
(`tool_choice` "required" or a named function), enforced token by token with llguidance.

Why llguidance: it is maintained by the guidance-ai team and is the structured-output backend of vLLM, SGLang
and llama.cpp, so the same JSON-schema subset behaves here as in the servers users move on to; it installs as one
wheel with no dependencies (xgrammar pulls triton, outlines-core and lm-format-enforcer add more), and it computes
a token mask in microseconds without compiling a grammar for the whole vocabulary up front.

`Grammars` (one per engine) wraps the tokenizer once (about a second, on first use); `Grammars.matcher(grammar)`
compiles one request's grammar and raises a 400 naming the field when it is invalid. `Constraint` is the
per-row state the engine uses: `mask(logits)` forbids every token the grammar does not allow next, `consume(token)`
advances it, `done` says the grammar is complete (the row ends). JSON is written with ", " and ": " separators
and no free whitespace, as roctune renders tool calls for training, so a model cannot loop on blank lines."""
from __future__ import annotations

import json
import threading

from roctune.data.answer_format import TOOL_FORMATS
from roctune.serve.errors import ApiError, bad_field

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema: dict) -> str:
    """An llguidance grammar for one JSON value following `schema`."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)


def _call_schema(tool: dict, args_key: str) -> dict:
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: fn["parameters"]},
            "required": ["name", args_key], "additionalProperties": False}


def tool_call_grammar(tools: list[dict], only: str | None, tool_format: str, parallel: bool) -> str:
    """A grammar for an answer that is one (or, `parallel`, several) calls in `tool_format`, to the function
    named `only` or to any of `tools`."""
    import llguidance

    fmt = TOOL_FORMATS[tool_format]
    chosen = [t for t in tools if only is None or t["function"]["name"] == only]
    schemas = [_call_schema(t, fmt.args_key) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    body = f"%json {json.dumps({**schema, 'x-guidance': JSON_STYLE})}"
    if fmt.whole_answer:
        return llguidance.LLMatcher.grammar_from_lark(f"start: {body}\n")
    call = f"{json.dumps(fmt.open + chr(10))} {body} {json.dumps(chr(10) + fmt.close)}"
    repeat = f' ("\\n" call)*' if parallel else ""
    return llguidance.LLMatcher.grammar_from_lark(f"start: call{repeat}\ncall: {call}\n")


class Grammars:
    """The engine's tokenizer as llguidance sees it, built on first use; compiles each request's grammar."""

    def __init__(self, tokenizer, n_vocab: int, eos_ids: set[int]):
        self._hf, self.n_vocab, self._eos = tokenizer, n_vocab, sorted(eos_ids)
        self._tok = None
        self._lock = threading.Lock()

    def _tokenizer(self):
        import llguidance.hf

        with self._lock:
            if self._tok is None:
                self._tok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.n_vocab, eos_token=self._eos)
            return self._tok

    def matcher(self, grammar: str, field: str):
        """A matcher for `grammar`; a 400 naming request field `field` when it cannot be compiled."""
        import llguidance

        tok = self._tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tok)
        if error:
            raise bad_field(field, f"field '{field}': the schema cannot be used for constrained decoding ({error})",
                            code="invalid_schema")
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
        if matcher.is_error():
            raise bad_field(field, f"field '{field}': {matcher.get_error()}", code="invalid_schema")
        return Constraint(matcher, self.n_vocab)


class Constraint:
    """One row's grammar state (see the module docstring). Used by the engine's worker only."""

    def __init__(self, matcher, n_vocab: int):
        self.matcher, self.n_vocab = matcher, n_vocab

    def mask(self, logits):
        """`logits` (one row) with every token the grammar forbids next set to -inf."""
        import numpy as np
        import torch

        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(words, bitorder="little")[:logits.shape[-1]].astype(bool)
        out = torch.full_like(logits, float("-inf"))
        keep = torch.from_numpy(allowed).to(logits.device)
        out[:keep.shape[0]][keep] = logits[:keep.shape[0]][keep]
        return out

    def consume(self, token: int) -> None:
        """Advance past `token`. The matcher fails only when the grammar outgrows llguidance's limits (a schema
        whose rules explode while decoding): a 400, since that request's schema is what to change."""
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise ApiError(400, f"constrained decoding stopped: {self.matcher.get_error()}; simplify the schema",
                           code="invalid_schema")

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped()
