"""`roctune eval`: is the fine-tune better than its base model on held-out data, and where? For both models, on
the same records: teacher-forced loss and perplexity (as training computes them), BLEU-4, ROUGE-1/2/L and exact
match of greedy answers against the reference answers; a report (HTML, Markdown, predictions JSONL) in --output
(default RUN/eval); --tasks runs lm-evaluation-harness benchmarks too. With --reward/--reward-file (a GRPO run):
--data holds prompts, and both models' greedy completions are scored by those rewards instead. On a --stage pt run,
--data is held-out raw text, and eval prints its loss and perplexity under both models. On a --stage rm run, --data
holds held-out preference pairs, and eval prints the reward model's pairwise accuracy (chosen scored above rejected);
--reward-model RUN scores greedy completions with such a reward model (as GRPO's reward)."""
from __future__ import annotations

import json
import os
import sys

from roctune import config
from roctune.config.agents import TOOL_SETTINGS
from roctune.hardware.choices import DEVICES, DTYPES


def register(sub) -> None:
    p = sub.add_parser("eval", help="compare a fine-tune with its base model on held-out data", description=__doc__)
    p.add_argument("--adapter", metavar="RUN", required=True, help="run directory from roctune train (or a PEFT "
                   "adapter directory)")
    p.add_argument("--data", metavar="FILE", action="append", required=True,
                   help="held-out records with reference answers, any training format (repeatable; DIR:name too)")
    p.add_argument("--output", metavar="DIR", help="report folder (default: RUN/eval for a roctune run)")
    p.add_argument("--json", action="store_true", help="print only {n, base: {...}, tuned: {...}} as JSON")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help=f"answer length (default {ANSWER_TOKENS}; with "
                   f"--tools, each episode's tokens, tool results included: default {EPISODE_TOKENS})")
    p.add_argument("--max-length", type=int, metavar="N", help="tokens per record (default: the run's)")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="answers generated at once (default 8)")
    p.add_argument("--tasks", metavar="NAME[,NAME]", help="lm-evaluation-harness tasks or task files (task.yaml); "
                   "needs pip install 'roctune[lm-eval]'")
    p.add_argument("--limit", type=int, metavar="N", help="with --tasks: at most N examples per task")
    p.add_argument("--model", metavar="NAME", help="base model (default: the run's, from run.yaml)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    # scoring by GRPO's rewards instead (--data: prompts; --max-new-tokens: completion length), declared once in config;
    # with --tools/--environment, as agents (--max-new-tokens: each episode's tokens, tool results included)
    config.add_flags(p, REWARD_SETTINGS + TOOL_SETTINGS)
    p.set_defaults(func=run)


REWARD_SETTINGS = ("rewards", "reward_weights", "reward_file", "reward_model", "answer_column", "format_regex",
                   "length_penalty_window")
ANSWER_TOKENS = 64  # --max-new-tokens' default
EPISODE_TOKENS = 256  # an agent episode's tokens by default (a call, its result and the answer), as GRPO's default
SHOWN_EPISODES = 3  # episodes printed for reading, base and tuned
REPORT_FLAGS = ("output", "tasks", "limit")  # the comparison report's options


def run_tools(args) -> int:
    """--tools/--environment: the base model and the fine-tune as agents with the same tools, scored by the rewards
    (the mean reward: the success rate of a 0/1 reward), with their tool-call figures."""
    from roctune.agents.files import catalog_of, env_rewards, spec_of
    from roctune.config.grpo import GrpoSettings
    from roctune.data.prompts import load_prompts
    from roctune.eval import rewards as rw
    from roctune.eval.agentic import evaluate_tools
    from roctune.generate import load_for_inference
    from roctune.stages import owner

    _refuse_report_flags(args, "--tools/--environment")
    _check_numbers(args)
    names = REWARD_SETTINGS + TOOL_SETTINGS
    cfg = config.from_sources(flags={n: getattr(args, n) for n in names if hasattr(args, n)})
    cfg.stage, cfg.device = owner(GrpoSettings), args.device
    cfg.max_completion_length = args.max_new_tokens or EPISODE_TOKENS
    GrpoSettings.check(cfg)
    rw.build(cfg, cfg.reward_file, env_rewards(cfg, catalog_of(spec_of(cfg))))  # before the model loads
    rw.check_columns(cfg, load_prompts(args.data))
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    result = evaluate_tools(cfg, loaded, args.data, args.batch_size, say, args.adapter)
    if args.json:
        print(json.dumps({k: result[k] for k in ("n", "base", "tuned")}))
        return 0
    from roctune.agents.episodes import transcript

    for x in result["examples"][:SHOWN_EPISODES]:
        print(f"\nprompt: {x['prompt']}")
        for side in ("base", "tuned"):
            print(f" {side} (reward {x[side + '_reward']:g}):\n{transcript(x[side])}")
    print(f"\nagent episodes on {result['n']} held-out prompts (greedy; mean reward: higher is better)")
    for key in result["base"]:
        print(f"  {key:<28} base {result['base'][key]:>8}   tuned {result['tuned'][key]:>8}")
    return 0


def _refuse_report_flags(args, how: str) -> None:
    """The comparison report's options on an eval that prints other numbers: refused in one line, not ignored."""
    from roctune.errors import ConfigError

    for flag in REPORT_FLAGS:
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag} belongs to the comparison of answers; with {how} eval prints the mean "
                              f"rewards (--json for a machine-readable result): drop --{flag}")


def _check_numbers(args) -> None:
    from roctune.errors import ConfigError

    for name in ("max_new_tokens", "max_length", "batch_size", "limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0 (got {value})")


def run_rewards(args) -> int:
    """--reward/--reward-file: mean reward of greedy completions, base vs fine-tuned, on held-out prompts."""
    from roctune.config.grpo import GrpoSettings
    from roctune.data.prompts import load_prompts
    from roctune.eval import rewards as rw
    from roctune.eval.rewarded import evaluate_rewards
    from roctune.generate import load_for_inference
    from roctune.stages import owner

    _refuse_report_flags(args, "--reward/--reward-file")
    _check_numbers(args)
    cfg = config.from_sources(flags={n: getattr(args, n) for n in REWARD_SETTINGS if hasattr(args, n)})
    cfg.stage, cfg.device = owner(GrpoSettings), args.device
    cfg.max_completion_length = args.max_new_tokens or ANSWER_TOKENS
    GrpoSettings.check(cfg)
    rw.build(cfg, cfg.reward_file)  # the rewards and the prompts are checked before the model loads
    rw.check_columns(cfg, load_prompts(args.data))
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    result = evaluate_rewards(cfg, loaded, args.data, args.batch_size, say)
    if args.json:
        print(json.dumps({k: result[k] for k in ("n", "base", "tuned")}))
        return 0
    print(f"mean reward of greedy completions on {result['n']} held-out prompts (higher is better)")
    for key in result["base"]:
        print(f"  {key:<28} base {result['base'][key]:>8}   tuned {result['tuned'][key]:>8}")
    return 0


def run_text(args, run) -> int:
    """A run evaluated on text (continued pretraining): loss and perplexity of held-out text (--data: .txt files or
    a text column), base vs fine-tuned, in the run's --max-length blocks."""
    from roctune.eval import text

    docs, max_length = text.prepare(args.data, run, args.max_length)
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    result = text.evaluate(run, docs, max_length, say, args.model, device=args.device, dtype=args.dtype,
                           trust_remote_code=args.trust_remote_code)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"held-out text: {result['n']} block(s) of {max_length} tokens (lower is better)")
    for key in ("loss", "perplexity"):
        print(f"  {key:<12} base {result['base'][key]:>10}   tuned {result['tuned'][key]:>10}")
    return 0


def run_pairs(args, run) -> int:
    """A reward model's run: its pairwise accuracy on held-out preference pairs (--data)."""
    from roctune.eval.reward_model import pairwise

    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    result = pairwise(run, args.data, say, args.batch_size, args.max_length, device=args.device,
                      dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"reward model on {result['n']} held-out pair(s): chosen scored above rejected in "
          f"{100 * result['accuracy']:.1f}% (mean score chosen {result['chosen']}, rejected {result['rejected']}, "
          f"margin {result['margin']})")
    return 0


def run_answers(args, run) -> int:
    """The fine-tune's answers against the reference answers, base vs tuned: a report (and --tasks)."""
    from roctune import rundir
    from roctune.eval import report
    from roctune.eval.run import Options, evaluate, prepare

    out = args.output or (os.path.join(run.path, rundir.EVAL_DIR) if run.is_run else None)
    if out:
        report.check_output(out)
    opts = Options(run, args.data, args.model, args.max_new_tokens or ANSWER_TOKENS, args.max_length,
                   args.batch_size,
                   args.device, args.dtype, args.trust_remote_code, args.tasks, args.limit)
    records, max_length, tasks = prepare(opts)
    # with --json, stdout carries the JSON alone: progress goes to stderr
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    result = evaluate(opts, records, max_length, tasks, say)
    if out:
        report.write(out, result)
        say(f"report: {os.path.join(out, 'report.html')} (also report.md, predictions.jsonl)")
    summary = {k: result[k] for k in ("n", "base", "tuned", "tasks") if k in result}
    if args.json:
        print(json.dumps(summary))
    else:
        _table(summary)
    return 0


# How a run is evaluated, by its stage row's `evaluated` (roctune.stages.EVALUATIONS): the function, and for those that
# print their own numbers what they measure (the comparison report's --output, --tasks and --limit are refused there).
EVALUATIONS = {"answers": (run_answers, None), "text": (run_text, "the held-out text's loss and perplexity"),
               "pairs": (run_pairs, "its accuracy on held-out preference pairs")}


def run(args) -> int:
    if getattr(args, "tools", None) or getattr(args, "environment", None):
        return run_tools(args)
    if getattr(args, "rewards", None) or getattr(args, "reward_file", None) or getattr(args, "reward_model", None):
        return run_rewards(args)
    from roctune import rundir
    from roctune.errors import ConfigError

    _check_numbers(args)
    run_ = rundir.open(args.adapter)
    evaluate, measures = EVALUATIONS[run_.stage.evaluated]
    for flag in REPORT_FLAGS if measures else ():  # refused, not silently ignored
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag}: {args.adapter} is a --stage {run_.stage.name} run, whose eval is {measures} "
                              f"(printed; --json for a machine-readable result): drop --{flag}")
    return evaluate(args, run_)


def _table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from roctune.eval.report import ROWS

    table = Table(title=f"base vs fine-tuned on {summary['n']} held-out records")
    for col in ("metric", "base", "tuned"):
        table.add_column(col)
    for key, label, better in ROWS:
        table.add_row(f"{label} ({better} is better)", str(summary["base"][key]), str(summary["tuned"][key]))
    Console().print(table)
