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


# ------------------------------------------------------------------------------------- episode rules
def test_the_turn_and_token_limits_end_episodes(default_model_dir, lookup_file):
    """--max-tool-turns rounds of calls at most (the next turn's calls are not run: cut by turns); results that
    would fill the token budget are not added (cut by tokens); a turn cut by the budget runs no call."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    spec = parse_spec([lookup_file], None, 10, 2048)
    lamp = call("lookup", item="lamp")
    made, _ = run_scripted(tok, spec, ["Q?"], ep.Limits(2, 300), [[lamp, lamp, lamp, "never"]])
    e = made[0]
    assert e.cut == "turns" and e.calls == 3 and e.valid == 2 and sum(m["role"] == "tool" for m in e.messages) == 2
    assert e.mask[-1] == 1 and len([m for m in e.messages if m["role"] == "assistant"]) == 3
    made, _ = run_scripted(tok, spec, ["Q?"], ep.Limits(5, 40), [[lamp, "never"]])
    assert made[0].cut == "tokens" and made[0].valid == 1 and all(made[0].mask)  # the results did not fit
    made, _ = run_scripted(tok, spec, ["Q?"], ep.Limits(5, 10), [[lamp]])
    assert made[0].cut == "tokens" and made[0].calls == 0 and len(made[0].ids) == 10  # cut inside the call


ENV = '''
class Counter:
    """A counter the model may add to; its reward is how close it gets to the row's target."""

    def reset(self, target: int = 0, **row) -> str:
        self.n, self.target = 0, target
        return f" (the target is {target})"

    def add(self, k: int) -> str:
        """Add to the counter.

        Args:
            k: how much
        """
        self.n += k
        return str(self.n)

    def crash(self) -> str:
        """End the tool process."""
        import os
        os._exit(9)

    def get_reward(self) -> float:
        return -abs(self.target - self.n)

    def _helper(self):
        return None
'''


def test_an_environment_per_episode_survives_a_crash_of_the_tool_process(default_model_dir, tmp_path):
    """--environment: a fresh instance per episode, reset(**row) appended to the prompt, public methods as tools,
    get_reward() as a reward; a call that kills the tool process is an error for its episode, and every
    environment is rebuilt (its calls replayed) so the others go on from where they were."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    (tmp_path / "env.py").write_text(ENV)
    spec = parse_spec([], f"{tmp_path / 'env.py'}:Counter", 10, 2048)
    catalog = describe(spec)
    assert catalog.names == ["add", "crash"] and catalog.reward and catalog.environment == "Counter"
    scripts = [[call("add", k=2), call("add", k=3), "done"], [call("add", k=1), call("crash"), "oops"]]
    from roctune.data.prompts import PromptRecord

    recs = [PromptRecord("x", [{"role": "user", "content": "Count"}], {"target": 5})]
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    with ToolSession(spec) as session:
        made = ep.start(tok, catalog, session, recs, 2, [0, 1])
        assert "Count (the target is 5)" in tok.decode(made[0].prompt)
        ep.run(made, scripted(tok, stop, scripts), tok, "hermes", session, ep.Limits(3, 300), {stop})
        assert session.restarts == 1
        assert ep.rewards_of(session, made) == [0.0, -4.0]  # 2 + 3 = 5 kept across the restart; 1 in the other
    assert made[1].error_kinds == {"crash": 1}
    assert "crash ended the tool process (it exited with code 9)" in made[1].messages[3]["content"]


def test_schemas_are_transformers_and_bad_files_are_one_line(tmp_path, lookup_file):
    import importlib.util

    from transformers.utils import get_json_schema

    from roctune.errors import ToolError

    spec = importlib.util.spec_from_file_location("shop_schema", lookup_file)
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)
    (tmp_path / "more.py").write_text(LOOKUP + "\n\ndef helper(x):\n    return x\n\n\nimport json\n")
    assert describe(parse_spec([str(tmp_path / "more.py")], None, 10, 2048)).schemas == [get_json_schema(shop.lookup)]
    for text, says in (("def f(x: int) -> int:\n    '''No args documented.'''\n    return x\n", "f"),
                       ("import not_a_module_anywhere\n", "ModuleNotFoundError"),
                       ("def _private(x: int) -> int:\n    '''Hidden.'''\n", "no tools found")):
        (tmp_path / "bad.py").write_text(text)
        with pytest.raises(ToolError) as e:
            describe(parse_spec([str(tmp_path / "bad.py")], None, 10, 2048))
        assert str(tmp_path / "bad.py") in str(e.value) and says in str(e.value) and "\n" not in str(e.value)


def test_tool_files_only_from_the_command_line(tmp_path):
    from roctune import config
    from roctune.errors import ConfigError
    from roctune.webui.train_form import form_specs

    for line in ("tools: [evil.py]", "environment: evil.py:Env"):
        (tmp_path / "c.yaml").write_text("stage: grpo\nrewards: [answer]\n" + line + "\n")
        with pytest.raises(ConfigError, match="only be given on the command line"):
            config.from_sources(str(tmp_path / "c.yaml"))
    with pytest.raises(ConfigError, match="only be given on the command line"):
        config.from_sources(overrides=["tools=evil.py"])
    names = {s["name"] for s in form_specs()}
    assert not names & {"tools", "environment", "reward_file"} and "max_tool_turns" in names
    cfg = config.from_sources(flags={"stage": "sft", "data": ["d"], "output": "o", "tools": ["t.py"]})
    with pytest.raises(ConfigError, match="--tools runs GRPO's agent episodes .* --stage grpo; drop it for --stage sft"):
        cfg.validate()


def test_keyed_sampling_does_not_depend_on_the_batch(tiny_model_dir):
    """An episode's tokens depend on its key and position only: alone, in another batch, in another order."""
    from transformers import AutoModelForCausalLM

    from roctune.decoding import sample_completions, sample_key

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    keys = [(sample_key(1, 0, i), 0) for i in range(3)]
    together = sample_completions(model, prompts, [6, 4, 6], 1.0, 0.9, set(), 0, None, "cpu", keys)
    alone = [sample_completions(model, [p], 6, 1.0, 0.9, set(), 0, None, "cpu", [k])[0] for p, k in zip(prompts, keys)]
    assert [len(x) for x in together] == [6, 4, 6] and together[0] == alone[0] and together[2] == alone[2]
    assert together[1] == alone[1][:4]
    reordered = sample_completions(model, prompts[::-1], 6, 1.0, 0.9, set(), 0, None, "cpu", keys[::-1])
    assert reordered[::-1][0] == alone[0] and reordered[0] == alone[2]
    later = sample_completions(model, [prompts[0] + together[0][:3]], 3, 1.0, 0.9, set(), 0, None, "cpu",
                               [(keys[0][0], 3)])
    assert later[0] == together[0][3:]  # a turn continues its episode's draws
    other = sample_completions(model, [prompts[0]], 6, 1.0, 0.9, set(), 0, None, "cpu", [(sample_key(2, 0, 0), 0)])
    assert other[0] != alone[0]


# ------------------------------------------------------------------------------ resume, two processes
PROBE_OK = PROBE.replace("BODY", "return f'probed {x}: 7'")
VOWELS = ("def vowels(completions, **kwargs):\n"
          "    texts = [c[-1]['content'] for c in completions]\n"
          "    return [sum(ch in 'aeiou' for ch in t) / (1 + len(t)) for t in texts]\n")


def agent_cfg(tmp_path, model, out, **kw):
    (tmp_path / "probe.py").write_text(PROBE_OK)
    (tmp_path / "vowels.py").write_text(VOWELS)
    settings = dict(rewards=[], reward_file=[str(tmp_path / "vowels.py")], max_steps=4, num_generations=2,
                    max_completion_length=72, kl_beta=0.05, lora_dropout=0.1, temperature=1.0)
    return tool_cfg(tmp_path, model, str(tmp_path / "probe.py"), out, **{**settings, **kw})


def test_agent_grpo_resume_gives_the_uninterrupted_run(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """Episodes (a scripted call, its result, then the model's own sampled answer) are the same after --resume:
    the same rewards per step and the same adapter."""
    from agent_policy import call_ids, install
    from conftest import read_metrics, resume_after_a_kill, run_train
    from safetensors.torch import load_file

    install(call_ids(tokenizer, "probe", x="a"), monkeypatch.setattr)
    run_train(agent_cfg(tmp_path, tiny_model_dir, "full"))
    resume_after_a_kill(lambda out, **kw: agent_cfg(tmp_path, tiny_model_dir, out.name, **kw), tmp_path / "full",
                        tmp_path / "part")
    full, part = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["reward"] for r in part] == [r["reward"] for r in full] and len({r["reward"] for r in full}) > 1
    assert all(r["valid_tool_calls"] == 1.0 for r in full)
    a, b = load_file(tmp_path / "full" / "adapter_model.safetensors"), load_file(tmp_path / "part" /
                                                                                   "adapter_model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


@pytest.mark.slow
def test_agent_grpo_two_processes_equal_one_with_twice_the_accumulation(tiny_model_dir, tokenizer, tmp_path,
                                                                        monkeypatch):
    """--nproc 2 (gloo, DDP) samples the same episodes as one process with twice the accumulation (keyed draws),
    so the losses and rewards per step are the same."""
    import subprocess
    import sys

    from agent_policy import call_ids, site_folder
    from conftest import REPO, read_metrics, run_train

    ids = call_ids(tokenizer, "probe", x="a")
    one = agent_cfg(tmp_path, tiny_model_dir, "one", grad_accum=2, max_steps=2, lora_dropout=0.0)
    import agent_policy

    agent_policy.install(ids, monkeypatch.setattr)
    site = site_folder(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, REPO]), OMP_NUM_THREADS="1",
               ROCTUNE_TEST_CALL_IDS=json.dumps(ids))
    cmd = [sys.executable, "-m", "roctune", "train", "--stage", "grpo", "--data", one.data[0], "--output",
           str(tmp_path / "two"), "--model", tiny_model_dir, "--device", "cpu", "--nproc", "2", "--tools",
           str(tmp_path / "probe.py"), "--reward-file", str(tmp_path / "vowels.py"), "--num-generations", "2",
           "--max-completion-length", "72", "--batch-size", "1", "--grad-accum", "1", "--max-steps", "2",
           "--target-modules", "all-linear", "--lr", "5e-3", "--lora-dropout", "0", "--kl-beta", "0.05",
           "--seed", "3", "--max-tool-turns", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_train(one)
    two, single = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert [r["completions"] for r in two] == [4, 4] and all(r["valid_tool_calls"] == 1.0 for r in two)
    assert [r["reward"] for r in two] == pytest.approx([r["reward"] for r in single], abs=1e-6)
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in single], rel=1e-4, abs=1e-7)
    assert any(r["loss"] != 0 for r in single)


# ------------------------------------------------------------------------------------------ eval, chat
USED_TOOL = ("def used_tool(completions, **kwargs):\n"
             "    # reads the whole episode: 1 when a tool returned a result\n"
             "    return [float(any(m['role'] == 'tool' and not m['content'].startswith('error') for m in c))\n"
             "            for c in completions]\n")


@pytest.fixture(scope="module")
def agent_grpo_run(tiny_model_dir, tokenizer, tmp_path_factory):
    """A 1-step agent GRPO run on the tiny model (the stand-in policy calls probe first)."""
    from agent_policy import call_ids, install
    from conftest import run_train

    tmp = tmp_path_factory.mktemp("agent-run")
    mp = pytest.MonkeyPatch()
    install(call_ids(tokenizer, "probe", x="a"), mp.setattr)
    try:
        run_train(agent_cfg(tmp, tiny_model_dir, "run", max_steps=1))
    finally:
        mp.undo()
    return tmp


def test_eval_with_tools_reports_base_and_tuned_agents(agent_grpo_run, tokenizer, monkeypatch, capsys):
    from agent_policy import call_ids, install
    from roctune.cli import main

    tmp = agent_grpo_run
    (tmp / "used.py").write_text(USED_TOOL)
    install(call_ids(tokenizer, "probe", x="a"), monkeypatch.setattr)
    capsys.readouterr()
    assert main(["eval", "--adapter", str(tmp / "run"), "--data", str(tmp / "p.jsonl"), "--tools",
                 str(tmp / "probe.py"), "--reward-file", str(tmp / "used.py"), "--max-new-tokens", "60",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["n"] == 4
    for side in ("base", "tuned"):
        assert got[side]["reward"] == 1.0 and got[side]["reward_used_tool"] == 1.0
        assert got[side]["tool_calls"] == got[side]["valid_tool_calls"] == 1.0 and got[side]["tool_errors"] == 0
        assert set(got[side]) >= {"malformed_share", "cut_tokens", "cut_turns"}
    # a tools file that is not there: one line naming the flag, before any model loads
    assert main(["eval", "--adapter", str(tmp / "run"), "--data", str(tmp / "p.jsonl"), "--tools",
                 str(tmp / "nope.py"), "--reward", "answer"]) != 0
    assert "--tools" in capsys.readouterr().err


def test_chat_with_tools_shows_calls_and_results(agent_grpo_run, tokenizer, monkeypatch, capsys):
    import io
    import sys

    from agent_policy import call_ids, install
    from roctune.cli import main

    tmp = agent_grpo_run
    install(call_ids(tokenizer, "probe", x="b"), monkeypatch.setattr)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Probe b please\n/quit\n"), "utf-8"))
    capsys.readouterr()
    assert main(["chat", "--adapter", str(tmp / "run"), "--device", "cpu", "--tools", str(tmp / "probe.py"),
                 "--max-new-tokens", "60"]) == 0
    out = capsys.readouterr().out
    assert "tools probe" in out and "you> Probe b please" in out
    assert 'assistant calls probe({"x": "b"})' in out and "tool probe: probed b: 7" in out


def test_what_a_tool_returns_or_prints_is_checked_at_the_border(tmp_path):
    """Results are text (TRL's str(result)), cut at RESULT_LIMIT characters; what a tool prints never reaches
    the answers; arguments that do not fit the signature, and a result whose str() raises, are errors."""
    from roctune.agents.worker import RESULT_LIMIT

    (tmp_path / "odd.py").write_text('''
import sys


def big(n: int) -> str:
    """Much text.

    Args:
        n: characters
    """
    print("noise on stdout " * 100)
    print("noise on stderr", file=sys.stderr)
    return "x" * n


def shaped(a: int) -> dict:
    """A dict.

    Args:
        a: a number
    """
    return {"a": a, "list": [1, 2]}


class Bad:
    def __str__(self):
        raise RuntimeError("no text")


def weird(a: int) -> str:
    """An object that has no text.

    Args:
        a: a number
    """
    return Bad()
''')
    spec = parse_spec([str(tmp_path / "odd.py")], None, 10, 2048)
    with ToolSession(spec) as s:
        long = s.call(0, "big", {"n": RESULT_LIMIT + 50})
        assert long.error is None and long.text.startswith("x" * RESULT_LIMIT)
        assert long.text.endswith(f"[cut: the result had {RESULT_LIMIT + 50} characters]")
        assert s.call(0, "shaped", {"a": 3}).text == "{'a': 3, 'list': [1, 2]}"
        assert s.call(0, "weird", {"a": 1}).text == "error: weird raised RuntimeError: no text"
        assert s.call(0, "shaped", {"b": 3}).error == "bad_arguments"
        assert s.call(0, "shaped", {"a b": 3, "a": 1}).error == "bad_arguments"
        assert s.restarts == 0
