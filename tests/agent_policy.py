"""A stand-in policy for agent runs on a tiny random model (which never writes a tool call by itself): an
episode's first turn is a scripted call, and every later turn is the model's own keyed sample
(roctune.decoding.sample_completions), so a run exercises calls, tool results, their masks and real sampling.
`install(call_ids)` patches roctune.decoding; in processes a test starts (--nproc 2), a sitecustomize.py written by
`site_folder` installs it from $ROCTUNE_TEST_CALL_IDS."""
from __future__ import annotations

import json
import os

SITE = """import os
if os.environ.get("ROCTUNE_TEST_CALL_IDS"):
    import sys
    sys.path.insert(0, {tests!r})
    import agent_policy
    agent_policy.install(__import__("json").loads(os.environ["ROCTUNE_TEST_CALL_IDS"]))
"""


def install(call_ids: list[int], patch=None) -> None:
    """Patch roctune.decoding.sample_completions (with `patch`, pytest's monkeypatch.setattr, when given)."""
    import roctune.decoding as decoding

    real = decoding.sample_completions

    def sample_completions(model, prompts, max_new_tokens, temperature, top_p, eos_ids, pad_id, gen, device,
                           keys=None):
        if keys is None:
            return real(model, prompts, max_new_tokens, temperature, top_p, eos_ids, pad_id, gen, device, keys)
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        later = [i for i, k in enumerate(keys) if k[1] > 0]
        out = [list(call_ids[:limit]) for limit in limits]
        if later:
            sampled = real(model, [prompts[i] for i in later], [limits[i] for i in later], temperature, top_p,
                           eos_ids, pad_id, gen, device, [keys[i] for i in later])
            for i, ids in zip(later, sampled):
                out[i] = ids
        return out

    (patch or setattr)(decoding, "sample_completions", sample_completions)


def site_folder(folder: str) -> str:
    """A folder holding a sitecustomize.py that installs the policy in every python started with it on
    PYTHONPATH and $ROCTUNE_TEST_CALL_IDS set."""
    with open(os.path.join(folder, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(SITE.format(tests=os.path.dirname(os.path.abspath(__file__))))
    return folder


def call_ids(tokenizer, name: str, **arguments) -> list[int]:
    """A hermes call and the end of the turn, as token ids."""
    text = f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
