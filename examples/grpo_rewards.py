"""Reward functions in TRL's convention, for `roctune train --stage grpo --reward-file examples/grpo_rewards.py`
(every public function here) or `--reward-file examples/grpo_rewards.py:short_answer` (one of them).

Each gets the prompts, the completions (strings for text prompts, [{"role": "assistant", "content": ...}] for
message prompts), their token ids, and the dataset's other columns as keyword arguments, one value per completion;
it returns one float per completion (None where it does not apply)."""
import re


def _text(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def exact_sum(completions, answer, **kwargs):
    """1 when the completion's last number is the `answer` column."""
    out = []
    for c, a in zip(completions, answer):
        numbers = re.findall(r"-?\d+", _text(c))
        out.append(1.0 if numbers and int(numbers[-1]) == int(a) else 0.0)
    return out


def short_answer(completions, completion_ids, **kwargs):
    """Up to 0.2 for answering in few tokens (0 at 24 tokens or more)."""
    return [0.2 * max(0.0, 1 - len(ids) / 24) for ids in completion_ids]
