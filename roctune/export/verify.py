"""The fidelity check after writing a GGUF, measured the way llama.cpp judges a quant (`llama-perplexity
--kl-divergence`): the mean KL divergence of the GGUF's next-token distributions from the merged model's, and how
often both put the same token on top, over every position of a few conversations of the run's training data.
With llama.cpp's library installed (the `gguf` extra) the file is run by llama.cpp itself, the program that will
serve it: its loader must accept the file, its tokenizer must split each rendered prompt into the same token ids
as the model's own, and its greedy answers (to its end-of-generation token) are compared and shown. Without it,
transformers reads the file back (dequantizing it) with the tokenizer and chat template stored in it, and the
same figures are taken. Either way the stored chat template must be the tokenizer's. This catches a wrong Q/K
permutation, a lost tensor, a wrong norm or key, a bad vocabulary or a missing template - each of which would
otherwise only show as a model that talks nonsense in Ollama.

Why KL and not whole greedy answers or the largest logit difference: a quantized model's greedy answer flips
wherever the merged model's top two tokens are nearly tied, and which near-tie flips depends on the CPU's kernels
(llama.cpp multiplies q8_0 weights by activations it quantizes to 8 bits too, with AVX2, AVX-512 VNNI or AMX
code summing in different orders), so equal answers cannot be required on every processor; a maximum over 49k
logits mostly measures one outlier. The mean KL divergence over hundreds of positions is stable across kernels
and says how much the distribution the user samples from moved."""
from __future__ import annotations

import logging
import os

from roctune import rundir
from roctune.data.render import render_prompt
from roctune.errors import RoctuneError
from roctune.models import stop_token_ids
from roctune.progress import counted

logger = logging.getLogger(__name__)

N_PROMPTS = 3  # greedy answers compared (and shown)
N_TEXTS = 8  # conversations whose every position enters the KL divergence
NEW_TOKENS = 16


def kl_limit(quant: str) -> float:
    """The largest mean KL divergence the check accepts for `quant` (its row in roctune.export.quants says why)."""
    from roctune.export.quants import QUANTS

    return QUANTS[quant].kl_limit


def check_conversations(run: "str | rundir.Run", n: int = N_TEXTS) -> list[list[dict]]:
    """The first `n` conversations of the run's training data (whole, answers included); the merge's fixed
    prompts when the data is not readable any more. run.yaml keeps the data paths as training was given them: a
    relative one is looked for from here, then beside the run's folder and its parents (training usually ran from
    the project folder that holds both)."""
    from roctune.merge import CHECK_PROMPTS

    if isinstance(run, str):
        run = rundir.open(run) if rundir.is_run_dir(run) else None
    data = run.config.get("data") if run is not None and run.is_run else None
    try:
        from roctune.data.records import load_records

        records = load_records([_find_data(d, run.path) for d in data], limit=n) if data else []
    except RoctuneError as e:
        logger.warning("training data not readable (%s); checking on fixed prompts", e)
        records = []
    conversations = [r.messages for r in records if any(m["role"] != "assistant" for m in r.messages)]
    return conversations or [list(p) for p in CHECK_PROMPTS]


def prompt_of(messages: list[dict]) -> list[dict]:
    """The conversation up to its last turn that is not an answer: what the model is asked."""
    last = max(i for i, m in enumerate(messages) if m["role"] != "assistant")
    return messages[:last + 1]


def _find_data(spec: str, run: str) -> str:
    path = spec.split(":", 1)[0] if not os.path.exists(spec) else spec
    if os.path.isabs(path) or os.path.exists(path):
        return spec
    folder = os.path.dirname(os.path.abspath(run))
    while True:
        if os.path.exists(os.path.join(folder, path)):
            return os.path.join(folder, spec)
        if os.path.dirname(folder) == folder:
            return spec
        folder = os.path.dirname(folder)


def verify(merged_dir: str, gguf_dir: str, gguf_name: str, quant: str, conversations: list[list[dict]],
           log=lambda *_: None, lora: str | None = None, tokenizer=None, hint: str = "") -> dict:
    """Compare the GGUF with the merged model, counting the conversations through `log` when it takes a while;
    raise when it is off, return the figures otherwise. The GGUF is run by llama.cpp itself when its library is
    installed (the consumer: its loader, tokenizer and kernels), else read back by transformers. `lora`: a LoRA
    GGUF that llama.cpp applies to the GGUF (then the GGUF is the base and `merged_dir` the merged model).
    `hint`: the next option to try, added to the refusal."""
    from roctune.export import llamacpp
    from roctune.merge import CHECK_PROMPTS

    ref, tok = _load_reference(merged_dir, tokenizer)
    path = os.path.join(gguf_dir, gguf_name)
    runs = reference_runs(ref, tok, conversations, log)
    if llamacpp.available():
        report = by_llama_cpp(path, runs, tok, lora)
    else:
        report = by_transformers(gguf_dir, gguf_name, runs, tok)
    fixed = [list(p) for p in CHECK_PROMPTS] == conversations
    report = {"quant": quant, "prompts": len(report["answers"]), "texts": len(runs),
              "prompts_from": "fixed prompts" if fixed else "the training data", "kl_limit": kl_limit(quant),
              **report}
    if not report["mean_kl"] <= report["kl_limit"]:  # written so that a NaN fails too
        raise RoctuneError(failure_message(report, gguf_name, lora) + (f"; {hint}" if hint else ""))
    return report


def failure_message(report: dict, gguf_name: str, lora: str | None) -> str:
    quant = report["quant"]
    what = f"{os.path.basename(lora)} applied to an {quant} GGUF of the base" if lora else gguf_name
    return (f"{what} differs from the merged model by a mean KL divergence of {report['mean_kl']:.3g} "
            f"(> {report['kl_limit']:g} for {quant}; the same top token at {100 * report['same_top']:.1f}% of "
            f"{report['positions']} positions, in {report['checked_by']}); not saved")


def reference_runs(ref, tok, conversations: list[list[dict]], log=lambda *_: None) -> list[dict]:
    """The merged model on each conversation: the token ids of the whole conversation as training tokenized it
    and its logits at every position; for the first N_PROMPTS also the prompt's text, ids and greedy answer."""
    return [_reference_run(ref, tok, msgs, with_answer=i < N_PROMPTS)
            for i, msgs in enumerate(counted(conversations, "checking gguf conversation", log))]


def _load_reference(merged_dir: str, tokenizer=None):
    """The merged model in fp32 and its tokenizer (the one given: export has loaded it already)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return (AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval(),
                tokenizer or AutoTokenizer.from_pretrained(merged_dir))
    finally:
        hf_logging.enable_progress_bar()


def _without_unsupported_system(tok, msgs: list[dict]) -> list[dict]:
    """The messages as this template takes them: a template without a system role (Gemma 2's raises) gets the
    conversation without it."""
    try:
        render_prompt(tok, prompt_of(msgs))
        return msgs
    except Exception:
        if not msgs or msgs[0]["role"] != "system":
            raise
        return msgs[1:]


def _reference_run(ref, tok, msgs: list[dict], with_answer: bool) -> dict:
    import torch

    from roctune.data.render import tokenize_conversation

    msgs = _without_unsupported_system(tok, msgs)
    if any(m["role"] == "assistant" for m in msgs):
        seq = tokenize_conversation(tok, msgs)[0]
    else:
        seq = tok(render_prompt(tok, msgs), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        run = {"seq": seq, "seq_logits": ref(torch.tensor([seq])).logits[0].numpy()}
    if not with_answer:
        return run
    text = render_prompt(tok, prompt_of(msgs))
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    stops = stop_token_ids(ref, tok)
    with torch.no_grad():
        logits = ref(**ids).logits[0, -1].numpy()
        out = ref.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=stops,
                           pad_token_id=stops[0] if stops else None)
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    cut = next((i for i, t in enumerate(new) if t in stops), len(new))
    return {**run, "msgs": prompt_of(msgs), "text": text, "ids": ids["input_ids"][0].tolist(), "logits": logits,
            "new": new[:cut]}


def by_llama_cpp(path: str, runs: list[dict], tok, lora: str | None = None, repack: bool = True,
                 same_template: bool = True) -> dict:
    """The consumer's own check: llama.cpp loads the file, splits each rendered prompt into the same token ids
    as the merged model's tokenizer, its distributions over every position of the conversations are compared, and
    its greedy answer (to its end-of-generation token) is compared with the merged model's. `repack`: llama.cpp's
    default CPU path, which repacks quantized weights for the processor's wide kernels (AMX, AVX-512 VNNI,
    AVX2 tiles) where it has them; False runs its plain per-block dot products (`--no-repack`). `same_template`:
    the file must carry the tokenizer's chat template (False for a file roctune did not write, such as the
    original GGUF a LoRA GGUF goes onto)."""
    from roctune.export import llamacpp

    model = llamacpp.Model(path, lora=lora, repack=repack)
    try:
        if same_template and model.chat_template() != (tok.chat_template or None):
            raise RoctuneError(f"the chat template in {os.path.basename(path)} is not the tokenizer's; not saved")
        pairs, diffs, answers = [], [], []
        for run in runs:
            pairs.append((run["seq_logits"], model.logits_all(run["seq"])))
            if "text" not in run:
                continue
            if model.tokenize(run["text"]) != run["ids"]:
                raise RoctuneError(f"llama.cpp splits a prompt into other tokens with {os.path.basename(path)} "
                                   "than the model's tokenizer; not saved")
            logits, new = model.run(run["ids"], NEW_TOKENS)
            diffs.append(_diff(run["logits"], logits))
            answers.append(_answer(tok, run["new"], new))
    finally:
        model.close()
    return _figures("llama.cpp" if repack else "llama.cpp --no-repack", pairs, diffs, answers)


def by_transformers(gguf_dir: str, gguf_name: str, runs: list[dict], tok) -> dict:
    """Without llama.cpp: transformers reads the GGUF back (dequantizing it), with its tokenizer and template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        got = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
        got_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    except Exception as e:  # a file transformers cannot read is exactly what this check is for
        raise RoctuneError(f"the written {gguf_name} cannot be read back ({type(e).__name__}: {e}); not saved") from None
    finally:
        hf_logging.enable_progress_bar()
    pairs, diffs, answers = [], [], []
    for run in runs:
        with torch.no_grad():
            pairs.append((run["seq_logits"], got(torch.tensor([run["seq"]])).logits[0].numpy()))
        if "text" not in run:
            continue
        if render_prompt(got_tok, run["msgs"]) != run["text"]:
            raise RoctuneError(f"the chat template in {gguf_name} renders a prompt differently; not saved")
        if got_tok(run["text"], add_special_tokens=False)["input_ids"] != run["ids"]:
            raise RoctuneError(f"the tokenizer in {gguf_name} splits a prompt differently; not saved")
        ids = torch.tensor([run["ids"]])
        with torch.no_grad():
            diffs.append(_diff(run["logits"], got(ids).logits[0, -1].numpy()))
            out = got.generate(ids, max_new_tokens=len(run["new"]) or 1, do_sample=False,
                               pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()[:len(run["new"])]
        answers.append(_answer(tok, run["new"], out))
    return _figures("transformers", pairs, diffs, answers)


def _answer(tok, merged: list[int], gguf: list[int]) -> dict:
    """Both greedy answers, whether they are equal, and how many tokens they share from the start."""
    same = next((i for i, (a, b) in enumerate(zip(merged, gguf)) if a != b), min(len(merged), len(gguf)))
    return {"merged": tok.decode(merged), "gguf": tok.decode(gguf), "equal": merged == gguf, "same_tokens": same}


def divergence(ref, got) -> tuple[list[float], list[bool]]:
    """Per position (rows of two [positions, vocab] logit arrays): KL(merged || gguf) in nats, computed in float64
    from log-softmaxes, and whether the top token is the same."""
    import numpy as np

    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    same = np.asarray(ref).argmax(axis=-1) == np.asarray(got).argmax(axis=-1)
    return kl.tolist(), same.tolist()


def _diff(ref, got) -> tuple[float, float]:
    """(max |difference|, the same relative to the spread (std) of the merged model's logits)."""
    import numpy as np

    worst = float(np.abs(np.asarray(ref) - np.asarray(got)).max())
    return worst, worst / max(float(np.std(ref)), 1e-9)


def _figures(by: str, pairs: list, diffs: list, answers: list) -> dict:
    import numpy as np

    kl, same = [], []
    for ref, got in pairs:
        k, s = divergence(ref, got)
        kl += k
        same += s
    return {"checked_by": by, "positions": len(kl), "mean_kl": round(float(np.mean(kl)), 6),
            "kl_99": round(float(np.percentile(kl, 99)), 5), "max_kl": round(float(np.max(kl)), 5),
            "same_top": round(float(np.mean(same)), 4),
            "max_abs_logit_diff": round(max(d[0] for d in diffs), 4) if diffs else None,
            "max_rel_logit_diff": round(max(d[1] for d in diffs), 4) if diffs else None,
            "answers_equal": sum(a["equal"] for a in answers), "answers": answers}


def summary(report: dict) -> str:
    return (f"fidelity check ({report['quant']}, {report.get('texts', report['prompts'])} conversations from "
            f"{report.get('prompts_from', 'the training data')}, run by {report['checked_by']}): mean KL divergence "
            f"{report['mean_kl']:.3g} (limit {report['kl_limit']:g}), same top token at "
            f"{100 * report['same_top']:.1f}% of {report['positions']} positions, greedy answers equal "
            f"{report['answers_equal']}/{report['prompts']}")


def size_text(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.1f} MiB"
