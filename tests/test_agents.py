"""Agent episodes (--tools, --environment): the loss and gradients against TRL's GRPOTrainer(tools=...) on the same
episodes (the episodes' tokens built the way TRL builds them, tool results masked in both), the tool process's
limits (a tool that raises, hangs, allocates too much, tries the network or ends the process: the episode shows the
error and the run finishes), the schemas, the episode rules (turn and token limits, malformed calls), and the
settings refused from a file."""
from __future__ import annotations

import json
import os

import pytest

from roctune.agents import episodes as ep
from roctune.agents.sandbox import ToolSession, describe, parse_spec

G = 4
LOOKUP = '''
PRICES = {"lamp": 417, "rug": 1290}


def lookup(item: str) -> str:
    """Look up an item of the catalogue.

    Args:
        item: the item's name
    """
    return f"{item}: {PRICES[item]} credits"
'''


@pytest.fixture(scope="module")
def lookup_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "shop.py"
    path.write_text(LOOKUP)
    return str(path)


# ------------------------------------------------------------------------------- scripted episodes
def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# Each episode's model turns, in order (8 episodes: 2 prompts x G). Every turn ends with the stop token.
SCRIPTS = [
    [call("lookup", item="lamp"), "It costs 417 credits."],
    ["I think 12."],
    [call("lookup", item="nope"), "Sorry, I do not know."],  # the tool raises: its error is the result
    [call("lookup", item="lamp") + "\n" + call("lookup", item="rug"), "417 and 1290."],  # two calls in one turn
    ['<tool_call>\n{"name": "lookup", "arguments": {bad json\n</tool_call>'],  # malformed: an answer
    [call("lookup", item="rug"), call("lookup", item="lamp"), "Both found."],  # two rounds
    [call("nosuch", x=1), "Hm."],  # an unknown tool
    ["1290"],
]


def scripted(tokenizer, stop: int, scripts=SCRIPTS):
    """A `Generate` that writes each episode's next scripted turn (episode keys are their indices), cut at its
    token limit as decoding would cut it."""
    turns = {i: list(s) for i, s in enumerate(scripts)}

    def generate(prompts, limits, keys):
        out = []
        for limit, (key, _) in zip(limits, keys):
            ids = tokenizer(turns[key].pop(0), add_special_tokens=False)["input_ids"] + [stop]
            out.append(ids[:limit])
        return out
    return generate


def qwen_tokenizer(default_model_dir):
    """The bundled tokenizer with TRL's Qwen2.5 chat template, which renders tools (TRL needs one that does)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    tok.chat_template = qwen2_5_chat_template
    return tok


def records(questions):
    from roctune.data.prompts import PromptRecord

    return [PromptRecord("x", [{"role": "user", "content": q}], {"answer": 417}) for q in questions]


def run_scripted(tok, spec, questions, limits=ep.Limits(3, 200), scripts=SCRIPTS):
    from roctune.agents.files import catalog_of

    catalog = catalog_of(spec)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    with ToolSession(spec) as session:
        made = ep.start(tok, catalog, session, records(questions), len(scripts) // len(questions),
                        list(range(len(scripts))))
        ep.run(made, scripted(tok, stop, scripts), tok, "hermes", session, limits, {stop})
    return made, catalog


# ---------------------------------------------------------------------------------------- TRL's loss
@pytest.fixture(scope="module")
def trl_tools(default_model_dir, lookup_file, tmp_path_factory):
    """TRL's GRPOTrainer with the same tool, on a tiny model with the bundled tokenizer; and roctune's episodes."""
    pytest.importorskip("trl", reason="TRL is in the test extra")
    import importlib.util

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from test_grpo import _tiny

    tok = qwen_tokenizer(default_model_dir)
    spec = importlib.util.spec_from_file_location("shop_for_trl", lookup_file)
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=G,
                      num_generations=G, max_completion_length=200, report_to="none", use_cpu=True, temperature=0.7,
                      bf16=False, max_tool_calling_iterations=3)
    trainer = GRPOTrainer(model=_tiny(len(tok), tok.pad_token_id), args=args, processing_class=tok,
                          reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], tools=[shop.lookup],
                          train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "a"}]]}))
    trainer.current_gradient_accumulation_steps = 1
    made, _ = run_scripted(tok, parse_spec([lookup_file], None, 10, 2048), ["How much is a lamp?", "How much is a rug?"])
    return trainer, tok, shop, made


def test_episodes_are_built_as_trl_builds_them(trl_tools):
    """The same tokens: TRL's prompt with the tool list, then each model turn, then the tool results' tokens as
    TRL's _get_tool_suffix_ids makes them; masks 0 exactly on those."""
    trainer, tok, shop, made = trl_tools
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    for i, e in enumerate(made):
        question = "How much is a lamp?" if i < G else "How much is a rug?"
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], tools=[shop.lookup],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        assert e.prompt == prompt
        want, mask, tools = [], [], []
        for m in e.messages:
            if m["role"] == "tool":
                tools.append(m)
                continue
            if tools:
                back = trainer._get_tool_suffix_ids(tools)
                want, mask, tools = want + back, mask + [0] * len(back), []
            turn = SCRIPTS[i][len([x for x in e.messages[:e.messages.index(m)] if x["role"] == "assistant"])]
            ids = tok(turn, add_special_tokens=False)["input_ids"] + [stop]
            want, mask = want + ids, mask + [1] * len(ids)
        assert e.ids == want and e.mask == mask
    assert [e.calls for e in made] == [1, 0, 1, 2, 0, 2, 1, 0] and [e.malformed for e in made][4] == 1
    assert [e.valid for e in made] == [1, 0, 0, 2, 0, 2, 0, 0] and made[2].error_kinds == {"raised": 1}
    assert "error: lookup raised KeyError: 'nope'" in made[2].messages[1]["content"]
    assert made[6].error_kinds == {"unknown_tool": 1} and all(e.cut is None for e in made)


VARIANTS = [("dapo", "token", 0.0), ("grpo", "token", 0.04), ("bnpo", "token", 0.0), ("dr_grpo", "token", 0.0),
            ("grpo", "sequence", 0.0)]


@pytest.mark.parametrize("loss_type, level, beta", VARIANTS, ids=lambda v: str(v))
def test_tool_episode_loss_and_gradients_equal_trl(trl_tools, loss_type, level, beta):
    """Loss and gradients of roctune's GRPO loss on the episodes (labels only on the model's tokens) equal TRL's
    _compute_loss with tool_mask, within 1e-5."""
    import torch

    from roctune.data.render import Tokenized
    from roctune.training import grpo_loss as gl
    from roctune.training.batching import collate
    from roctune.training.losses import Head
    from test_grpo import _tiny

    trainer, tok, _, made = trl_tools
    s = gl.LossSettings(loss_type, beta=beta, level=level, max_completion_length=200)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv, _ = gl.group_advantages(rewards, G, "group")
    pad = tok.pad_token_id
    prompts = torch.tensor([e.prompt for e in made])  # the two prompts have the same length: no left padding
    width = max(len(e.ids) for e in made)
    comp = torch.tensor([e.ids + [pad] * (width - len(e.ids)) for e in made])
    cmask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in made])
    tmask = torch.tensor([e.mask + [1] * (width - len(e.mask)) for e in made])
    ours_model = _tiny(len(tok), pad)
    items = [Tokenized(e.prompt + e.ids, [-100] * len(e.prompt) + [t if m else -100 for t, m in zip(e.ids, e.mask)],
                       "x") for e in made]
    batch = collate(items, pad, False, "cpu")
    with torch.no_grad():
        logp0, rows = gl.completion_logprobs(ours_model, batch, Head(), 0.7)
    ref = logp0 + 0.05 * torch.sin(torch.arange(len(logp0), dtype=torch.float32))  # a reference apart from it
    flat_ref = torch.zeros(cmask.shape)
    flat_ref[(cmask * tmask).bool()] = ref

    trainer.loss_type, trainer.beta, trainer.importance_sampling_level = loss_type, beta, level
    trainer.epsilon_low = trainer.epsilon_high = 0.2
    trainer.max_completion_length = 200
    model = trainer.model
    model.zero_grad()
    model.train()
    inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": comp,
              "completion_mask": cmask, "tool_mask": tmask, "advantages": adv, "ref_per_token_logps": flat_ref,
              "num_items_in_batch": (cmask * tmask).sum()}
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()

    logp, rows = gl.completion_logprobs(ours_model, batch, Head(), 0.7)
    total, _ = gl.micro_batch_loss(s, logp.float(), logp.detach().float(), ref, adv.float(), rows, len(items))
    mine = total / sum(s.item_weight(e.model_tokens) for e in made)
    mine.backward()
    assert abs(float(mine) - float(theirs)) < 1e-5, (float(mine), float(theirs))
    assert float(theirs) != 0.0
    grads = dict(model.named_parameters())
    worst = max(float((p.grad - grads[n].grad).abs().max()) for n, p in ours_model.named_parameters())
    assert worst < 1e-5
    # the tool results were masked out: scoring them too would change the loss
    assert int((cmask * tmask).sum()) < int(cmask.sum())


# ------------------------------------------------------------------------------ tools that fail, in a run
PROBE = '''
import os, signal, socket, sys, time


def probe(x: str) -> str:
    """Probe a thing.

    Args:
        x: what to probe
    """
    BODY
'''
FAILURES = {
    "raises": ("raise ValueError('no such thing')", "probe raised ValueError: no such thing", "raised"),
    "hangs": ("time.sleep(60)", "probe ran past its time limit of 1 s", "timeout"),
    "hangs-deaf": ("signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGPROF}); time.sleep(60)",
                   "probe ran past its time limit of 1 s (its process was stopped)", "timeout"),
    "allocates": ("return str(len(bytearray(2 << 30)))", "probe ran out of memory", "memory"),
    "network": ("socket.create_connection(('127.0.0.1', PORT), timeout=5).close(); return 'connected'", "probe raised "
                "OSError:", "raised"),
    "exits": ("os._exit(3)", "probe ended the tool process (it exited with code 3)", "crash"),
    "sys-exit": ("sys.exit(2)", "probe called sys.exit(2)", "exit"),
}


def scripted_sampler(tokenizer, first: str, then: str = "It is 7."):
    """Stands in for roctune.decoding.sample_completions: an episode's first turn is `first`, every later one
    `then` (which turn it is comes from the episode's key counter: the model tokens drawn before)."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample_completions(model, prompts, max_new_tokens, temperature, top_p, eos_ids, pad_id, gen, device,
                           keys=None):
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else max_new_tokens
        out = []
        for limit, (_, drawn) in zip(limits, keys or [(0, 0)] * len(prompts)):
            ids = tokenizer(first if drawn == 0 else then, add_special_tokens=False)["input_ids"] + [stop]
            out.append(ids[:limit])
        return out
    return sample_completions


def tool_cfg(tmp_path, model, tools, out="run", **kw):
    from conftest import write_jsonl
    from roctune.config import TrainConfig

    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Probe thing {i}.", "answer": 7} for i in range(4)])
    base = dict(data=[data], output=str(tmp_path / out), model=model, device="cpu", stage="grpo", max_steps=1,
                batch_size=1, grad_accum=1, num_generations=2, max_completion_length=80, lr=5e-3, lora_dropout=0.0,
                rewards=["answer"], tools=[tools], tool_timeout=1.0, tool_memory_mb=512, max_tool_turns=2,
                target_modules=["all-linear"], seed=3, completion_samples_steps=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("mode", list(FAILURES))
def test_a_failing_tool_is_an_error_in_the_episode_and_the_run_finishes(tiny_model_dir, tokenizer, tmp_path,
                                                                         monkeypatch, mode):
    import socket

    import roctune.decoding
    from conftest import read_metrics, run_train

    body, says, kind = FAILURES[mode]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    tools = tmp_path / "probe.py"
    tools.write_text(PROBE.replace("BODY", body.replace("PORT", str(listener.getsockname()[1]))))
    monkeypatch.setattr(roctune.decoding, "sample_completions",
                        scripted_sampler(tokenizer, call("probe", x="a")))
    run_train(tool_cfg(tmp_path, tiny_model_dir, str(tools)))
    row = read_metrics(tmp_path / "run")[-1]
    assert row["tool_calls"] == 1.0 and row["valid_tool_calls"] == 0.0 and row["tool_errors"] == 1.0
    assert (tmp_path / "run" / "adapter_model.safetensors").exists()  # the run finished
    samples = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    for s in samples:  # the model read the error in a tool turn, then answered
        tool_turns = [m for m in s["completion"] if m["role"] == "tool"]
        assert len(tool_turns) == 1 and tool_turns[0]["content"].startswith("error: " + says), tool_turns
        assert s["completion"][-1] == {"role": "assistant", "content": "It is 7."} and s["reward"] == 1.0
    if mode == "network":
        assert "Network is unreachable" in tool_turns[0]["content"] or "disabled" in tool_turns[0]["content"]
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing came through
    listener.close()
