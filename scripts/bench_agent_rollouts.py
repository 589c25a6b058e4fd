"""Benchmark GRPO's agent rollouts (--tools): episodes per second and peak memory of roctune's (roctune.agents:
batched turns with roctune.decoding's KV-cache sampling, the tools in their own limited process, results appended
as tokens) against TRL 1.16's GRPOTrainer(tools=...) (its `_generate`: transformers' generate for each turn and
`_tool_call_loop`, the tools called in the trainer's process), on the same model, tools, prompts and limits:
the bundled SmolLM2-135M-Instruct with --adapter's LoRA (unmerged; a run that learned to call tools, e.g. the agent
example's warm-up or GRPO run), examples/agent_tools.py's lookup, the first --prompts questions of
examples/agent_catalogue.jsonl, --generations episodes each, --max-completion-length tokens per episode (tool
results included, both sides), --max-tool-turns rounds of calls, temperature 1.

Both sides render with the same chat template: TRL only runs tools with a template that renders them and whose
answers it can parse, so the bundled tokenizer gets TRL's Qwen2.5 template (hermes <tool_call> blocks, the format
roctune's fallback writes too) on both sides. Each side runs in its own process, a warm-up batch first, then
--repeats timed batches; peak memory is the process's resident maximum (ru_maxrss), and for roctune also its tool
processes'. The episodes differ between the sides (each samples its own), so their turns and calls per episode are
printed next to the speed.

    python scripts/bench_agent_rollouts.py --adapter RUN [--prompts 4] [--generations 8] [--repeats 2]

Run it alone (under the CPU lock here): on a shared CPU other processes change the figures by several times."""
from __future__ import annotations

import json
import os
import resource
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo_rollouts import run_sides, side_flags  # noqa: E402 - the rollout benchmarks' shared parts
DATA = os.path.join(REPO, "examples", "agent_catalogue.jsonl")
TOOLS = os.path.join(REPO, "examples", "agent_tools.py")


def _model(args):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from roctune.generate import load_for_inference

    loaded = load_for_inference(args.adapter, device="cpu")
    tok = AutoTokenizer.from_pretrained(loaded.base_model)
    tok.chat_template = qwen2_5_chat_template
    loaded.tokenizer = tok
    return loaded


def _roctune(args, loaded, records):
    from roctune.agents import episodes as ep
    from roctune.agents.files import catalog_of
    from roctune.agents.sandbox import ToolSession, parse_spec
    from roctune.decoding import sample_completions, sample_key
    from roctune.models import stop_token_ids

    tok = loaded.tokenizer
    spec = parse_spec([TOOLS], None, 10, 2048)
    catalog = catalog_of(spec)
    eos = set(stop_token_ids(loaded.model, tok))
    limits = ep.Limits(args.max_tool_turns, args.max_completion_length)
    batch = [0]

    def generate(prompts, lims, keys):
        return sample_completions(loaded.model, prompts, lims, 1.0, 1.0, eos, tok.pad_token_id, None, "cpu", keys)

    def run():
        batch[0] += 1
        keys = [sample_key(0, batch[0], i) for i in range(len(records) * args.generations)]
        with ToolSession(spec) as session:
            made = ep.start(tok, catalog, session, records, args.generations, keys)
            ep.run(made, generate, tok, "hermes", session, limits, eos)
        turns = sum(sum(m["role"] == "assistant" for m in e.messages) for e in made)
        return len(made), turns, sum(e.calls for e in made), sum(len(e.ids) for e in made)
    return run


def _trl(args, loaded, records):
    import importlib.util
    import tempfile

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    spec = importlib.util.spec_from_file_location("agent_tools", TOOLS)
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    n = len(records) * args.generations
    cfg = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=n, num_generations=args.generations,
                     max_completion_length=args.max_completion_length, temperature=1.0, report_to="none",
                     use_cpu=True, bf16=False, max_tool_calling_iterations=args.max_tool_turns)
    prompts = [r.messages for r in records for _ in range(args.generations)]
    trainer = GRPOTrainer(model=loaded.model, args=cfg, processing_class=loaded.tokenizer, tools=[tools.lookup],
                          reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    trainer.model.eval()
    # what _generate_and_score_completions sets up before it calls _generate: the tools of each rollout
    trainer._sync_tool_dicts = [{"lookup": tools.lookup} for _ in range(n)]
    trainer._async_tool_dicts = [{} for _ in range(n)]

    def run():
        out = trainer._generate(prompts)
        completions, ids = out[3], out[1]
        turns = sum(sum(m["role"] == "assistant" for m in c) for c in completions)
        calls = sum(len(m.get("tool_calls") or []) for c in completions for m in c if m["role"] == "assistant")
        return len(ids), turns, calls, sum(len(x) for x in ids)
    return run


def one_side(args) -> dict:
    import torch

    from roctune.data.prompts import load_prompts

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = _model(args)
    records = load_prompts(DATA)[:args.prompts]
    run = (_roctune if args.side == "roctune" else _trl)(args, loaded, records)
    with torch.no_grad():
        run()  # warm-up
        totals = [0, 0, 0, 0]
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            totals = [a + b for a, b in zip(totals, run())]
    dt = time.perf_counter() - t0
    episodes, turns, calls, tokens = totals
    gib = 2 ** 20  # ru_maxrss is in KiB
    return {"side": args.side, "episodes": episodes, "seconds": round(dt, 2),
            "episodes_per_s": round(episodes / dt, 3), "tokens_per_s": round(tokens / dt, 1),
            "turns_per_episode": round(turns / episodes, 2), "calls_per_episode": round(calls / episodes, 2),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / gib, 3),
            "tool_processes_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / gib, 3)}


def main() -> None:
    p = side_flags(__doc__, 4, 96)
    p.add_argument("--adapter", required=True, metavar="RUN", help="a run that calls tools (the agent example's)")
    p.add_argument("--max-tool-turns", type=int, default=2)
    args = p.parse_args()
    if args.side:
        print(json.dumps(one_side(args)))
        return
    rows = run_sides(__file__, sys.argv[1:])
    print(f"roctune / TRL episodes per second: {rows[0]['episodes_per_s'] / rows[1]['episodes_per_s']:.2f}x; "
          f"tokens per second: {rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
