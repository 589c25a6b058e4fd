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
A reward model (`--reward-model RUN`, a --stage rm run: roctune.eval.reward_model) scores each completion; it comes
after the --reward-file functions in --reward-weights' order.

A user's own functions come from `--reward-file FILE.py[:NAME,...]`, given on the command line only (like
--trust-remote-code): it is code that runs in this process. Everything that runs its code (the import, the call,
iterating what it returned, converting each value to a float) runs inside one guard (`user_code`): any exception,
`sys.exit()` included, becomes one line naming the file and the function (`RewardError`); only Ctrl-C passes as
it is. Every value is checked: one per completion, a real number (or None), finite; so is the weighted sum. A file
that others could replace (a folder writable by others) is imported with a warning that names it."""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from roctune.config.grpo import REWARDS as BUILTINS  # --reward's choices
from roctune.errors import ConfigError, DataError, RewardError

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch here
log = logging.getLogger(__name__)


@dataclass
class Reward:
    name: str
    fn: Callable[..., list]
    weight: float = 1.0
    path: str | None = None  # the --reward-file it came from (None: a built-in)

    @property
    def who(self) -> str:
        return f"reward function '{self.name}' ({self.path})" if self.path else f"reward '{self.name}'"


@contextmanager
def user_code(who: str) -> Iterator[None]:
    """Run a user's code: any BaseException but Ctrl-C (SystemExit from sys.exit() included: a reward file must not
    end roctune with exit 0 and no result) becomes one RewardError line naming `who`. Only the user's own code goes
    inside, so a bug in roctune's code is never hidden by it."""
    try:
        yield
    except (KeyboardInterrupt, RewardError):
        raise
    except SystemExit as e:
        code = "" if e.code is None else _short(e.code)
        raise RewardError(f"{who} called sys.exit({code}); a reward function must return its values, not end "
                          "the process") from None
    except BaseException as e:  # noqa: BLE001 - the user's code: anything it raises is reported in one line
        detail = _first_line(e)
        raise RewardError(f"{who} raised {type(e).__name__}{': ' + detail if detail else ''}") from None


def _first_line(e: BaseException) -> str:
    """The first line of a user's exception's text ("" when its own __str__ fails: that is user code too)."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a user's __str__; the exception's type still names what happened
        return ""
    return text.splitlines()[0][:300] if text.strip() else ""


# ------------------------------------------------------------------------------------------- built-ins
def text_of(completion) -> str:
    """The text of a completion in either of TRL's formats; of an agent episode (messages with tool turns), its
    final answer: what the model wrote after the last tool result, never the tools' text."""
    if isinstance(completion, str):
        return completion
    turns = [m for m in completion if isinstance(m, dict)]
    last_tool = max((i for i, m in enumerate(turns) if m.get("role") == "tool"), default=-1)
    return "".join(str(m.get("content") or "") for m in turns[last_tool + 1:] if m.get("role") != "tool")


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
    warn_if_replaceable(path)
    module_name = f"roctune_reward_{abs(hash(os.path.realpath(path)))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    with user_code(f"--reward-file {path}: importing it"):
        loader.loader.exec_module(module)
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        missing = [n for n in wanted if not callable(getattr(module, n, None))]
        if missing:
            raise ConfigError(f"--reward-file {spec}: no function {', '.join(missing)} in {path}")
        return [Reward(n, getattr(module, n), path=path) for n in wanted]
    found = [Reward(n, f, path=path) for n, f in vars(module).items()
             if inspect.isfunction(f) and f.__module__ == module_name and not n.startswith("_")]
    if not found:
        raise ConfigError(f"--reward-file {path}: defines no public function (name one: {path}:FUNCTION)")
    return found


_warned: set[str] = set()  # a file is imported once by the checks and once by the run: one warning


def replaceable_by_others(path: str) -> str | None:
    """Why someone else could replace the file at `path` before it is imported (None: no one can). The file or any
    folder above it writable by others lets them swap the file (or a folder on the way) for their own, unless the
    folder has the sticky bit (like /tmp): there only an entry's owner may rename or remove it, so an entry owned
    by this user or root is safe, and one owned by someone else is theirs to change."""
    me = os.geteuid()
    real = os.path.realpath(path)
    if os.stat(real).st_mode & stat.S_IWOTH:
        return "the file is writable by other users"
    child = real
    while True:
        parent = os.path.dirname(child)
        st = os.stat(parent)
        if st.st_mode & stat.S_IWOTH:
            if not st.st_mode & stat.S_ISVTX:
                return f"the folder {parent} is writable by other users"
            owner = os.lstat(child).st_uid
            if owner not in (me, 0):
                return f"{child} belongs to another user (uid {owner}) in the shared folder {parent}"
        if parent == child:
            return None
        child = parent


def warn_if_replaceable(path: str) -> None:
    why = replaceable_by_others(path)
    if why and os.path.realpath(path) not in _warned:
        _warned.add(os.path.realpath(path))
        log.warning("warning: --reward-file %s: %s, so its code may not be yours; it runs as you now: move it to a "
                    "folder only you can write", path, why)


def build(cfg, reward_files: list[str], extra: tuple = ()) -> list[Reward]:
    """The built-ins cfg.rewards names, then the functions of each --reward-file, the reward model, then `extra`
    (an --environment's get_reward(), as TRL appends it), with cfg.reward_weights (one per function, in that order;
    all 1 when none are given)."""
    rewards = [Reward(n, builtin(n, cfg)) for n in cfg.rewards]
    for spec in reward_files:
        rewards += load_reward_file(spec)
    if getattr(cfg, "reward_model", None):  # a --stage rm run's scores (roctune.eval.reward_model), after the files
        from roctune.eval.reward_model import reward_function

        rewards.append(Reward("reward_model", reward_function(cfg.reward_model, text_of, cfg.device)))
    rewards += list(extra)
    if not rewards:
        raise ConfigError("--stage grpo needs a reward: --reward answer|format|length|json, --reward-file FILE.py "
                          "and/or --reward-model RUN")
    try:
        weights = [float(w) for w in cfg.reward_weights] if cfg.reward_weights else [1.0] * len(rewards)
    except ValueError:
        raise ConfigError(f"--reward-weights {' '.join(cfg.reward_weights)}: expected numbers, one per reward "
                          "function (e.g. --reward-weights 1 0.5)") from None
    if not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"--reward-weights {' '.join(cfg.reward_weights)}: each weight must be a finite number")
    if not sum(abs(w) for w in weights) < FLOAT32_MAX:
        raise ConfigError(f"--reward-weights {' '.join(cfg.reward_weights)}: rewards of 1 would already sum beyond "
                          f"{FLOAT32_MAX:.3g}, the largest float32 (GRPO's rewards and advantages are float32 "
                          "tensors); give smaller weights (e.g. --reward-weights 1 0.5)")
    if len(weights) != len(rewards):
        raise ConfigError(f"--reward-weights: {len(weights)} weight(s) for {len(rewards)} reward function(s) "
                          f"({', '.join(r.name for r in rewards)}); give one per function, in that order")
    for r, w in zip(rewards, weights):
        r.weight = w
    return rewards


def check_columns(cfg, records: list) -> None:
    """Every prompt record holds the column the `answer` reward compares with: found while the data is checked,
    before the model loads, not at the first step."""
    if "answer" not in cfg.rewards:
        return
    for r in records:
        if cfg.answer_column not in r.columns:
            fields = ", ".join(sorted(map(str, r.columns))) or "none"
            raise DataError(f"{r.source}: no column '{cfg.answer_column}' for --reward answer (its other fields: "
                            f"{fields}); add it to every record or name the column with --answer-column NAME")


# ------------------------------------------------------------------------------------------------ scoring
def call(reward: Reward, n: int, **kwargs) -> list[float]:
    """One reward function's values for `n` completions (NaN where it returned None); RewardError naming the
    function when it raises or returns something unusable."""
    import itertools

    with user_code(reward.who):
        out = reward.fn(**kwargs)
        if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
            raise RewardError(f"{reward.who} returned {type(out).__name__}; it must return a list of {n} numbers")
        values = list(itertools.islice(out, n + 1))  # n + 1: an endless generator is still refused
    if len(values) != n:
        many = f"more than {n}" if len(values) > n else str(len(values))
        raise RewardError(f"{reward.who} returned {many} values for {n} completions; return one per completion")
    return [_value(reward, i, v) for i, v in enumerate(values)]


def _value(reward: Reward, i: int, v) -> float:
    """One returned value as a finite float (NaN for None: the function does not score that completion)."""
    if v is None:
        return float("nan")
    if isinstance(v, (str, bytes)) or not (isinstance(v, numbers.Real) or hasattr(type(v), "__float__")):
        raise RewardError(f"{reward.who} returned {type(v).__name__} {_short(v)} for completion {i}; rewards must "
                          "be numbers (or None)")
    if type(v) in (int, bool):  # float() of an int beyond a float's range (10**400) raises: that is infinite
        f = float(v) if v.bit_length() < 1024 else math.inf
    else:
        with user_code(f"{reward.who}: converting its value for completion {i} to a number"):
            f = float(v)
    if not math.isfinite(f):
        raise RewardError(f"{reward.who} returned {_short(v)} for completion {i}; rewards must be finite numbers "
                          "(None marks a completion the function does not score)")
    return f


def _short(v) -> str:
    """A value as the message shows it: its repr, cut (10**400 has 401 digits; repr of an object is user code)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 30:
        return f"an integer of about {int(v.bit_length() * math.log10(2)) + 1} digits"
    text = repr(v) if isinstance(v, (int, float, str, bytes)) else f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


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
        total = sum(v * w for v, w in scored) if scored else float("nan")
        if math.isinf(total) or abs(total) > FLOAT32_MAX:
            terms = " + ".join(f"{v:g} x {w:g}" for v, w in scored)
            raise RewardError(f"the weighted reward of completion {len(out)} is {terms} = {total:g}, beyond the "
                              f"float32 range GRPO trains in; scale the reward values or --reward-weights down")
        out.append(total)
    return out
