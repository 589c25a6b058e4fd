"""Rewards for GRPO and for scoring generations (`roctune train --stage grpo`, `roctune eval`).

A reward function has TRL's calling convention, so a TRL reward file works unchanged:
`fn(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float]`, one value per completion,
None where it does not apply; `columns` are the dataset's other fields (e.g. `answer`), one value per completion.
Prompts and completions are strings when the record's prompt was a string, else lists of messages
(TRL's "conversational" format: completions are [{"role": "assistant", "content": text}]).

Built-ins (`--reward NAME`, weights with `--reward-weights`):
- answer: 1 when the completion's final answer equals the `--answer-column` column: numbers compared as numbers
  (the last number, or what follows "####", "answer:" or sits in \\boxed{}), else with `math-verify` where installed
  (LaTeX, fractions, sets), else as normalised text;
- format: 1 when `--format-regex` matches (re.search, DOTALL: anchor it with ^ and $ for a whole-text format);
- length: DAPO's soft overlong penalty: 0 up to max_completion_length - window tokens, then falling linearly to -1
  at max_completion_length;
- json: 1 when the completion (or a ```json fenced block in it) parses as JSON.

A user's own functions come from `--reward-file FILE.py[:NAME,...]`, given on the command line only (like
--trust-remote-code): it is code that runs in this process. A function that raises, returns the wrong number of
values, a non-number, NaN or infinity stops the run with one line naming the function (`RewardError`)."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from roctune.errors import ConfigError, RewardError

BUILTINS = ("answer", "format", "length", "json")


@dataclass
class Reward:
    name: str
    fn: Callable[..., list]
    weight: float = 1.0


# ------------------------------------------------------------------------------------------- built-ins
def text_of(completion) -> str:
    """The text of a completion in either of TRL's formats."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def _number(text: str) -> float | None:
    text = text.strip().rstrip(".").replace("$", "").strip()
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _boxed(text: str) -> str | None:
    """The content of the last \boxed{...}, nested braces included."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def final_answer(text: str) -> str:
    """The part of a completion that states its answer: \\boxed{...}, after the last '####' or 'answer:', the last
    number, or the whole text."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    for marker in (r"####", r"(?i)answer\s*(?:is|:)"):
        parts = re.split(marker, text)
        if len(parts) > 1:
            return parts[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else text


def _norm(text) -> str:
    return " ".join(re.sub(r"[\s.,;:!?\"'`*]+$", "", str(text).strip().lower()).split())


def answers_equal(completion: str, gold) -> bool:
    """Whether the completion's final answer equals `gold` (a number or a text): as numbers, as normalised text,
    then by math-verify where installed."""
    said = final_answer(completion)
    g = gold if isinstance(gold, (int, float)) and not isinstance(gold, bool) else _number(str(gold))
    numbers = _NUMBER.findall(said)
    if g is not None and numbers and (n := _number(numbers[-1])) is not None:
        if math.isclose(n, float(g), rel_tol=1e-6, abs_tol=1e-9):
            return True
    if _norm(said) == _norm(gold):
        return True
    return _math_verify(str(gold), said if "\\" in said else completion)


def _math_verify(gold: str, completion: str) -> bool:
    """math-verify's verdict where installed (no timeouts: they use signals, which need the main thread)."""
    import logging

    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call that timeouts are off
    try:
        return bool(verify(parse(gold, parsing_timeout=None), parse(completion, parsing_timeout=None),
                           timeout_seconds=None))
    except Exception:  # noqa: BLE001 - an unparsable answer is a wrong answer
        return False


def answer_reward(column: str) -> Callable:
    def answer(completions, **kw):
        if column not in kw:
            raise RewardError(f"reward 'answer': the data has no column '{column}' (give --answer-column NAME)")
        return [1.0 if answers_equal(text_of(c), g) else 0.0 for c, g in zip(completions, kw[column])]
    return answer


def format_reward(pattern: str) -> Callable:
    rx = re.compile(pattern, re.DOTALL)

    def format(completions, **kw):  # noqa: A001 - the reward's name as users see it
        return [1.0 if rx.search(text_of(c)) else 0.0 for c in completions]
    return format


def length_reward(max_len: int, window: int) -> Callable:
    window = max(1, min(window or max_len // 4, max_len))

    def length(completions, completion_ids=None, **kw):
        lens = ([len(x) for x in completion_ids] if completion_ids is not None
                else [len(text_of(c)) for c in completions])
        return [0.0 if n <= max_len - window else max(-1.0, (max_len - window - n) / window) for n in lens]
    return length


def _parses(text: str) -> bool:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    try:
        json.loads(fenced.group(1) if fenced else text.strip())
        return True
    except (ValueError, RecursionError):
        return False


def json_reward(completions, **kw):
    return [1.0 if _parses(text_of(c)) else 0.0 for c in completions]


def builtin(name: str, cfg) -> Callable:
    if name == "answer":
        return answer_reward(cfg.answer_column)
    if name == "format":
        return format_reward(cfg.format_regex)
    if name == "length":
        return length_reward(cfg.max_completion_length, cfg.length_penalty_window)
    if name == "json":
        return json_reward
    raise ConfigError(f"--reward {name}: unknown; built-ins are {', '.join(BUILTINS)} (or --reward-file FILE.py)")


# ------------------------------------------------------------------------------------------ user's files
def load_reward_file(spec: str) -> list[Reward]:
    """The functions of `FILE.py` (every public function defined in it, in order) or `FILE.py:NAME,NAME`."""
    import importlib.util
    import inspect

    path, _, names = spec.partition(".py:")
    path = path if path.endswith(".py") else path + ".py"
    if not os.path.isfile(path):
        raise ConfigError(f"--reward-file {spec}: no such Python file (give FILE.py or FILE.py:FUNCTION)")
    module_name = f"roctune_reward_{abs(hash(os.path.realpath(path)))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's code: any error is reported in one line
        raise RewardError(f"--reward-file {path}: importing it raised {type(e).__name__}: {e}") from None
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        missing = [n for n in wanted if not callable(getattr(module, n, None))]
        if missing:
            raise ConfigError(f"--reward-file {spec}: no function {', '.join(missing)} in {path}")
        return [Reward(n, getattr(module, n)) for n in wanted]
    found = [Reward(n, f) for n, f in vars(module).items()
             if inspect.isfunction(f) and f.__module__ == module_name and not n.startswith("_")]
    if not found:
        raise ConfigError(f"--reward-file {path}: defines no public function (name one: {path}:FUNCTION)")
    return found


def build(cfg, reward_files: list[str]) -> list[Reward]:
    """The built-ins cfg.rewards names, then the functions of each --reward-file, with cfg.reward_weights (one per
    function, in that order; all 1 when none are given)."""
    rewards = [Reward(n, builtin(n, cfg)) for n in cfg.rewards]
    for spec in reward_files:
        rewards += load_reward_file(spec)
    if not rewards:
        raise ConfigError("--stage grpo needs a reward: --reward answer|format|length|json and/or "
                          "--reward-file FILE.py")
    try:
        weights = [float(w) for w in cfg.reward_weights] if cfg.reward_weights else [1.0] * len(rewards)
    except ValueError:
        raise ConfigError(f"--reward-weights {' '.join(cfg.reward_weights)}: expected numbers, one per reward "
                          "function (e.g. --reward-weights 1 0.5)") from None
    if not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"--reward-weights {' '.join(cfg.reward_weights)}: each weight must be a finite number")
    if len(weights) != len(rewards):
        raise ConfigError(f"--reward-weights: {len(weights)} weight(s) for {len(rewards)} reward function(s) "
                          f"({', '.join(r.name for r in rewards)}); give one per function, in that order")
    for r, w in zip(rewards, weights):
        r.weight = w
    return rewards


# ------------------------------------------------------------------------------------------------ scoring
def call(reward: Reward, n: int, **kwargs) -> list[float]:
    """One reward function's values for `n` completions (NaN where it returned None); RewardError naming the
    function when it raises or returns something unusable."""
    who = f"reward function '{reward.name}'"
    try:
        out = reward.fn(**kwargs)
    except RewardError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: any error is reported in one line
        raise RewardError(f"{who} raised {type(e).__name__}: {e}") from None
    try:
        values = list(out)
    except TypeError:
        raise RewardError(f"{who} returned {type(out).__name__}; it must return a list of {n} numbers") from None
    if len(values) != n:
        raise RewardError(f"{who} returned {len(values)} values for {n} completions; return one per completion")
    result = []
    for i, v in enumerate(values):
        if v is None:
            result.append(float("nan"))
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise RewardError(f"{who} returned {v!r} for completion {i}; rewards must be numbers (or None)") from None
        if not math.isfinite(f):
            raise RewardError(f"{who} returned {f} for completion {i}; rewards must be finite numbers (None "
                              "marks a completion the function does not score)")
        result.append(f)
    return result


def reward_inputs(records: list, texts: list[str], per: int) -> tuple[list, list, dict]:
    """(prompts, completions, columns) for the reward functions from prompt records (roctune.data.prompts) and
    `per` completions of each, in TRL's formats: strings for a text prompt, messages otherwise."""
    rows = [r for r in records for _ in range(per)]
    ps = [r.messages[-1]["content"] if r.text_prompt else r.messages for r in rows]
    cs = [t if r.text_prompt else [{"role": "assistant", "content": t}] for r, t in zip(rows, texts)]
    keys = list(dict.fromkeys(k for r in records for k in r.columns))
    return ps, cs, {k: [r.columns.get(k) for r in rows] for k in keys}


def score(rewards: list[Reward], prompts: list, completions: list, completion_ids: list[list[int]],
          columns: dict[str, list], **extra: Any) -> list[list[float]]:
    """Every reward function's values for the completions: [function][completion]. TRL also hands its functions
    `log_extra` and `log_metric` callbacks; they are accepted here and do nothing, so such a file runs unchanged."""
    noop = lambda *a, **k: None  # noqa: E731
    kwargs = {**columns, "log_extra": noop, "log_metric": noop, **extra, "prompts": prompts,
              "completions": completions, "completion_ids": completion_ids}
    return [call(r, len(completions), **kwargs) for r in rewards]


def combine(per_func: list[list[float]], rewards: list[Reward]) -> list[float]:
    """The weighted sum per completion (a function's NaN counts 0); NaN where no function scored it (TRL's rule)."""
    out = []
    for vals in zip(*per_func):
        scored = [(v, r.weight) for v, r in zip(vals, rewards) if not math.isnan(v)]
        out.append(sum(v * w for v, w in scored) if scored else float("nan"))
    return out
