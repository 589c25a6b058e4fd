"""The fidelity check after writing a GGUF, on a few prompts from the run's training data. With llama.cpp's
library installed (the `gguf` extra) the file is run by llama.cpp itself, the program that will serve it: its
loader must accept the file, its tokenizer must split each rendered prompt into the same token ids as the
model's own, its logits after the prompt must stay within the quant type's tolerance of the merged model's, and
its greedy answer (to its end-of-generation token) is compared. Without it, transformers reads the file back
(dequantizing it) with the tokenizer and chat template stored in it, and the same comparisons are made. Either
way the stored chat template must be the tokenizer's. This catches a wrong Q/K permutation, a lost tensor, a
wrong norm or key, a bad vocabulary or a missing template - each of which would otherwise only show as a model
that talks nonsense in Ollama."""
from __future__ import annotations

import logging
import os

from roctune import rundir
from roctune.data.render import render_prompt
from roctune.errors import RoctuneError
from roctune.models import stop_token_ids
from roctune.progress import counted

logger = logging.getLogger(__name__)

# Max |logit difference| allowed against the fp32 merged model, per quant type. Measured on the bundled
# SmolLM2-135M after the identity fine-tune (logits span about +-30): f16 0.035, q8_0 1.16 (1.32 on the base
# model; one 8-bit scale per 32 weights across 30 layers). bf16 was not measured: its 8-bit mantissa rounds
# each weight by up to 0.4%, the same order as q8_0's step, so it gets q8_0's tolerance. The tolerances leave
# 2-7x room over the measured drift.
TOLERANCE = {"f16": 0.25, "bf16": 3.0, "q8_0": 3.0}
KQUANT_TOLERANCE = 8.0  # 2-6 bit weights: catches a broken file, not small drift (q4_k_m of the same run: 3.36)
N_PROMPTS = 3
NEW_TOKENS = 16


def check_prompts(run: str, n: int = N_PROMPTS) -> list[list[dict]]:
    """The first `n` prompts of the run's training data (each conversation up to its last answer); the merge's
    fixed prompts when the data is not readable any more. run.yaml keeps the data paths as training was given
    them: a relative one is looked for from here, then beside the run's folder and its parents (training usually
    ran from the project folder that holds both)."""
    from roctune.merge import CHECK_PROMPTS

    data = rundir.read_run(run)["config"].get("data") if rundir.is_run_dir(run) else None
    try:
        from roctune.data.records import load_records

        records = load_records([_find_data(d, run) for d in data], limit=n) if data else []
    except RoctuneError as e:
        logger.warning("training data not readable (%s); checking on fixed prompts", e)
        records = []
    prompts = []
    for r in records:
        last = max(i for i, m in enumerate(r.messages) if m["role"] != "assistant") if r.messages else -1
        if last >= 0:
            prompts.append(r.messages[:last + 1])
    return prompts or [list(p) for p in CHECK_PROMPTS]


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


def verify(merged_dir: str, gguf_dir: str, gguf_name: str, quant: str, prompts: list[list[dict]],
           log=lambda *_: None, lora: str | None = None, tokenizer=None) -> dict:
    """Compare the GGUF with the merged model, counting the prompts through `log` when it takes a while; raise
    when it is off, return the figures otherwise. The GGUF is run by llama.cpp itself when its library is
    installed (the consumer: its loader, tokenizer and kernels), else read back by transformers. `lora`: a LoRA
    GGUF that llama.cpp applies to the GGUF (then the GGUF is the base and `merged_dir` the merged model)."""
    from roctune.export import llamacpp

    ref, tok = _load_reference(merged_dir, tokenizer)
    path = os.path.join(gguf_dir, gguf_name)
    runs = [_reference_run(ref, tok, msgs) for msgs in counted(prompts, "checking gguf prompt", log)]
    tol = TOLERANCE.get(quant, KQUANT_TOLERANCE)
    if llamacpp.available():
        report = by_llama_cpp(path, runs, tok, lora)
    else:
        report = by_transformers(gguf_dir, gguf_name, runs, tok)
    from roctune.merge import CHECK_PROMPTS

    fixed = [list(p) for p in CHECK_PROMPTS] == prompts
    report = {"quant": quant, "prompts": len(prompts), "prompts_from": "fixed prompts" if fixed else
              "the training data", "tolerance": tol, **report}
    if report["max_abs_logit_diff"] > tol:
        what = f"{os.path.basename(lora)} applied to an {quant} GGUF of the base" if lora else gguf_name
        raise RoctuneError(f"{what} differs from the merged model by max |logit| "
                           f"{report['max_abs_logit_diff']:.3g} (> {tol:g} for {quant}, in {report['checked_by']}); "
                           "not saved")
    return report


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


def _reference_run(ref, tok, msgs: list[dict]) -> dict:
    """The merged model on one prompt: its text, token ids, last logits and greedy answer (to EOS or NEW_TOKENS)."""
    import torch

    try:
        text = render_prompt(tok, msgs)
    except Exception:  # a template without a system role (Gemma 2's raises): the prompt without it
        if not msgs or msgs[0]["role"] != "system":
            raise
        msgs = msgs[1:]
        text = render_prompt(tok, msgs)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    stops = stop_token_ids(ref, tok)
    with torch.no_grad():
        logits = ref(**ids).logits[0, -1].numpy()
        out = ref.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=stops,
                           pad_token_id=stops[0] if stops else None)
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    cut = next((i for i, t in enumerate(new) if t in stops), len(new))
    return {"msgs": msgs, "text": text, "ids": ids["input_ids"][0].tolist(), "logits": logits, "new": new[:cut]}


def by_llama_cpp(path: str, runs: list[dict], tok, lora: str | None = None) -> dict:
    """The consumer's own check: llama.cpp loads the file, splits each rendered prompt into the same token ids
    as the merged model's tokenizer, its logits after the prompt are compared, and its greedy answer (to its
    end-of-generation token) is compared with the merged model's."""
    from roctune.export import llamacpp

    model = llamacpp.Model(path, lora=lora)
    try:
        if model.chat_template() != (tok.chat_template or None):
            raise RoctuneError(f"the chat template in {os.path.basename(path)} is not the tokenizer's; not saved")
        diffs, answers = [], []
        for run in runs:
            if model.tokenize(run["text"]) != run["ids"]:
                raise RoctuneError(f"llama.cpp splits a prompt into other tokens with {os.path.basename(path)} "
                                   "than the model's tokenizer; not saved")
            logits, new = model.run(run["ids"], NEW_TOKENS)
            diffs.append(_diff(run["logits"], logits))
            answers.append({"merged": tok.decode(run["new"]), "gguf": tok.decode(new), "equal": new == run["new"]})
    finally:
        model.close()
    return _figures("llama.cpp", diffs, answers)


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
    diffs, answers = [], []
    for run in runs:
        if render_prompt(got_tok, run["msgs"]) != run["text"]:
            raise RoctuneError(f"the chat template in {gguf_name} renders a prompt differently; not saved")
        if got_tok(run["text"], add_special_tokens=False)["input_ids"] != run["ids"]:
            raise RoctuneError(f"the tokenizer in {gguf_name} splits a prompt differently; not saved")
        ids = torch.tensor([run["ids"]])
        with torch.no_grad():
            diffs.append(_diff(run["logits"], got(ids).logits[0, -1].numpy()))
            out = got.generate(ids, max_new_tokens=len(run["new"]) or 1, do_sample=False,
                               pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()[:len(run["new"])]
        answers.append({"merged": tok.decode(run["new"]), "gguf": tok.decode(out), "equal": out == run["new"]})
    return _figures("transformers", diffs, answers)


def _diff(ref, got) -> tuple[float, float]:
    """(max |difference|, the same relative to the spread (std) of the merged model's logits)."""
    import numpy as np

    worst = float(np.abs(np.asarray(ref) - np.asarray(got)).max())
    return worst, worst / max(float(np.std(ref)), 1e-9)


def _figures(by: str, diffs: list, answers: list) -> dict:
    return {"checked_by": by, "max_abs_logit_diff": round(max(d[0] for d in diffs), 4),
            "max_rel_logit_diff": round(max(d[1] for d in diffs), 4),
            "answers_equal": sum(a["equal"] for a in answers), "answers": answers}


def summary(report: dict) -> str:
    return (f"fidelity check ({report['quant']}, {report['prompts']} prompts from "
            f"{report.get('prompts_from', 'the training data')}, run by "
            f"{report['checked_by']}): max |logit difference| {report['max_abs_logit_diff']:.3g} (tolerance "
            f"{report['tolerance']:g}), greedy answers equal {report['answers_equal']}/{report['prompts']}")


def size_text(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.1f} MiB"
