"""`roctune chat --tools`: a conversation with the model as an agent. Each user message starts one episode over the
conversation so far (roctune.agents.episodes: the model's turns, its calls run in the conversation's tool process,
their results, until an answer without a call or a limit), and the episode's messages join the history, so the next
message sees the calls and results before it. An --environment gets one instance per conversation, reset with the
first user message as its `prompt` (a chat has no data row), its first observation appended to that message."""
from __future__ import annotations

import secrets
from typing import Callable

from roctune.agents import episodes as ep
from roctune.agents.files import catalog_of, spec_of
from roctune.agents.sandbox import ToolSession
from roctune.data.tool_turns import prompt_ids
from roctune.errors import ConfigError


class Conversation:
    """The tools and the model of one chat (`close` ends its tool process). `sides`: the episodes' slots in the
    tool process, one per model answering (the fine-tune, and the base with --compare), each with its own
    environment."""

    def __init__(self, loaded, cfg, temperature: float, top_p: float, adapter: str | None):
        from roctune.eval.agentic import tool_format_of
        from roctune.models import stop_token_ids

        self.loaded, self.temperature, self.top_p = loaded, temperature, top_p
        self.spec = spec_of(cfg)
        self.catalog = catalog_of(self.spec)
        self.fmt = tool_format_of(loaded, adapter)
        if self.fmt is None:
            raise ConfigError("--tools: this model's chat template writes tool calls in a format roctune cannot "
                              "parse")
        tok = loaded.tokenizer
        self.eos = set(stop_token_ids(loaded.model, tok))
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else min(self.eos)
        self.limits = ep.Limits(cfg.max_tool_turns, cfg.max_completion_length)
        self.session = ToolSession(self.spec)
        self.observation: dict[int, str | None] = {}

    def close(self) -> None:
        self.session.close()

    def _generate(self, use_adapter: bool) -> ep.Generate:
        import contextlib

        from roctune.decoding import sample_completions

        model = self.loaded.model

        def generate(prompts, limits, keys):
            ctx = (model.disable_adapter() if not use_adapter and hasattr(model, "disable_adapter")
                   else contextlib.nullcontext())
            with ctx:
                return sample_completions(model, prompts, limits, self.temperature, self.top_p, self.eos, self.pad,
                                          None, self.loaded.device, keys)
        return generate

    def answer(self, history: list[dict], side: int, use_adapter: bool,
               on_turn: Callable[[ep.Episode], None]) -> list[dict]:
        """One episode answering the last user message of `history`; returns its messages (calls, results, the
        answer) for the history. `on_turn(episode)` after each model turn."""
        messages = history
        if self.catalog.environment:
            if side not in self.observation:  # a new conversation: a fresh environment
                first = next(m["content"] for m in history if m["role"] == "user")
                self.observation[side] = self.session.reset(side, {"prompt": first})
            obs = self.observation[side]
            if obs:
                i = next(i for i, m in enumerate(history) if m["role"] == "user")
                messages = history[:i] + [{**history[i], "content": history[i]["content"] + obs}] + history[i + 1:]
        ids, in_think = prompt_ids(self.loaded.tokenizer, messages, self.catalog.schemas)
        from roctune.decoding import sample_key

        episode = ep.Episode(ids, in_think, key=sample_key(side, len(history), secrets.randbits(63)), slot=side)
        ep.run([episode], self._generate(use_adapter), self.loaded.tokenizer, self.fmt, self.session,
               self.limits, self.eos, on_turn=on_turn)
        return episode.messages

    def restart(self) -> None:
        """A new conversation: environments are reset at its first message."""
        self.observation.clear()
