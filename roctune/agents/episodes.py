"""Agent episodes: the model answers, its tool calls run, their results come back as tool turns, and it answers
again, until an answer without a call, the turn limit or the episode's token limit. Shared by GRPO's rollouts
(roctune.recipes.grpo_tools), `roctune eval --tools` and `roctune chat --tools`.

All episodes of a batch advance together, one model turn at a time: every episode still going is decoded in one
batch (`generate`, roctune.decoding or vLLM), each up to its own remaining budget; then the calls of every episode
run in the batch's tool process (roctune.agents.sandbox: one call after another, each with its time limit), and the
results' tokens are appended (roctune.data.tool_turns, as TRL builds them). An episode's tokens after its prompt are
the model's turns (mask 1: learned, they carry the advantage) and the tool turns (mask 0: never learned); the
budget (`max_tokens`, GRPO's --max-completion-length) counts both, as TRL's max_completion_length does.

Rules, as TRL's GRPOTrainer (trl 1.16, `_tool_call_loop`) has them: up to `max_turns` rounds of calls
(max_tool_calling_iterations), so at most max_turns + 1 model turns; results that would fill the budget end the
episode without them. roctune's own additions: a turn that did not end with a stop token (cut by the budget) never
runs its calls; an episode is `cut` "tokens" or "turns" when a limit ended it; a call block that does not parse is
counted as malformed and the turn is an answer, as TRL's parser leaves it.

Sampling is keyed: each episode has a key (roctune.decoding.sample_key of seed, step, prompt and sample), and its
n-th model token is drawn with the n-th uniform of that key, whatever else shares its batch or process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from roctune.agents.sandbox import Catalog, ToolSession
from roctune.data.tool_turns import parse_turn, prompt_ids, results_ids


@dataclass
class Episode:
    prompt: list[int]  # the rendered prompt with the tool list (and an environment's first observation)
    in_think: bool = False
    key: int = 0
    slot: int = 0  # its number in the tool process (where its environment lives)
    ids: list[int] = field(default_factory=list)  # everything after the prompt: model turns and tool turns
    mask: list[int] = field(default_factory=list)  # 1: the model wrote it; 0: a tool result (never learned)
    messages: list[dict] = field(default_factory=list)  # the transcript after the prompt (TRL's completion format)
    calls: int = 0  # calls parsed
    valid: int = 0  # calls that returned a result
    malformed: int = 0  # call blocks that did not parse
    errors: int = 0  # calls that failed (unknown tool, bad arguments, raised, timed out, out of memory, crashed)
    error_kinds: dict = field(default_factory=dict)
    cut: str | None = None  # "tokens" or "turns" when a limit ended the episode
    done: bool = False

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    @property
    def answer(self) -> str:
        """The final answer's text (the last model turn's content)."""
        last = [m for m in self.messages if m["role"] == "assistant"]
        return last[-1]["content"] if last else ""


@dataclass(frozen=True)
class Limits:
    max_turns: int  # rounds of tool calls (--max-tool-turns)
    max_tokens: int  # tokens after the prompt, tool results included (--max-completion-length)


# generate(prompts, limits, keys) -> completions: token ids of each prompt's next turn, at most limits[i] tokens,
# ending with a stop token when it stopped; keys[i] = (episode key, the number of model tokens drawn before).
Generate = Callable[[list[list[int]], list[int], list[tuple[int, int]]], list[list[int]]]


def start(tokenizer, catalog: Catalog, session: ToolSession | None, records: list, per: int,
          keys: list[int]) -> list[Episode]:
    """`per` episodes of each record (grouped by record, in order), their prompts rendered with the tool list;
    with an environment, each gets a fresh instance reset with the record's row (TRL: `reset(**row)`), whose first
    observation is appended to the last user message."""
    out = []
    for i, r in enumerate(records):
        for j in range(per):
            messages = r.messages
            if catalog.environment and session is not None:
                n = len(out)
                obs = session.reset(n, {"prompt": r.messages[-1]["content"] if r.text_prompt else r.messages,
                                        **r.columns})
                if obs:
                    messages = messages[:-1] + [{**messages[-1], "content": messages[-1]["content"] + obs}]
            ids, in_think = prompt_ids(tokenizer, messages, catalog.schemas)
            out.append(Episode(ids, in_think, keys[i * per + j], len(out)))
    return out


def run(episodes: list[Episode], generate: Generate, tokenizer, tool_format: str, session: ToolSession,
        limits: Limits, stop_ids: set, on_turn: Callable[[Episode], None] | None = None) -> None:
    """Advance every episode to its end (see the module docstring); `on_turn(episode)` after each turn of an
    episode (chat prints it)."""
    stop_texts = [tokenizer.decode([t]) for t in sorted(stop_ids)]
    for turn in range(limits.max_turns + 1):
        going = [i for i, e in enumerate(episodes) if not e.done]
        if not going:
            return
        outs = generate([episodes[i].prompt + episodes[i].ids for i in going],
                        [limits.max_tokens - len(episodes[i].ids) for i in going],
                        [(episodes[i].key, episodes[i].model_tokens) for i in going])
        for i, out in zip(going, outs):
            _take_turn(episodes[i], out, turn, tokenizer, tool_format, session, limits, stop_ids, stop_texts)
            if on_turn is not None:
                on_turn(episodes[i])


def _take_turn(e: Episode, out: list[int], turn: int, tokenizer, tool_format: str, session: ToolSession,
               limits: Limits, stop_ids: set, stop_texts: list[str]) -> None:
    """One model turn of an episode: parsed; its calls run unless a limit ends the episode first."""
    e.ids += out
    e.mask += [1] * len(out)
    stopped = bool(out) and out[-1] in stop_ids
    message, malformed = parse_turn(tokenizer.decode(out, skip_special_tokens=True), tool_format, e.in_think,
                                    cut=not stopped)
    e.messages.append(message)
    e.malformed += malformed
    calls = message.get("tool_calls", [])
    e.calls += len(calls)
    if not calls or not stopped or turn == limits.max_turns:
        e.done = True
        e.cut = None if stopped and not calls else ("turns" if stopped else "tokens")
        return
    results = []
    for c in calls:
        name, arguments = c["function"]["name"], c["function"]["arguments"]
        got = session.call(e.slot, name, arguments)
        if got.error is None:
            e.valid += 1
        else:
            e.errors += 1
            e.error_kinds[got.error] = e.error_kinds.get(got.error, 0) + 1
        results.append({"role": "tool", "name": name, "content": got.text})
    back = results_ids(tokenizer, results, stop_texts)
    if len(e.ids) + len(back) >= limits.max_tokens:  # no room left to answer: the results are not added (TRL)
        e.done, e.cut = True, "tokens"
        return
    e.ids += back
    e.mask += [0] * len(back)
    e.messages += results


def transcript(messages: list[dict]) -> str:
    """An episode's messages as lines to read: each call, each result, each answer."""
    import json

    lines = []
    for m in messages:
        if m["role"] == "tool":
            lines.append(f"  tool {m.get('name', '')}: {m['content']}")
            continue
        if m.get("content", "").strip():
            lines.append(f"  assistant: {m['content'].strip()}")
        for c in m.get("tool_calls", []):
            f = c["function"]
            lines.append(f"  assistant calls {f['name']}({json.dumps(f['arguments'], ensure_ascii=False)})")
    return "\n".join(lines) or "  (nothing)"


def rewards_of(session: ToolSession, episodes: list[Episode]) -> list[float]:
    """Each episode's environment reward (get_reward(); NaN where it gave none)."""
    out = []
    for e in episodes:
        value = session.reward(e.slot)
        out.append(float("nan") if value is None else value)
    return out


def sums(episodes: list[Episode]) -> dict[str, float]:
    """The step's tool figures, summed over episodes (the recipe divides by the count): calls parsed, valid calls,
    errors, episodes cut by the token and the turn limits; and the counts behind the malformed share."""
    return {"tool_calls": float(sum(e.calls for e in episodes)),
            "valid_tool_calls": float(sum(e.valid for e in episodes)),
            "tool_errors": float(sum(e.errors for e in episodes)),
            "malformed_calls": float(sum(e.malformed for e in episodes)),
            "call_attempts": float(sum(e.calls + e.malformed for e in episodes)),
            "cut_tokens": float(sum(e.cut == "tokens" for e in episodes)),
            "cut_turns": float(sum(e.cut == "turns" for e in episodes))}
