"""The fidelity check after writing a GGUF: read the file back with transformers (it dequantizes f16, bf16 and
q8_0 on load) together with the tokenizer and chat template stored in it, and compare with the merged model on a
few prompts from the run's training data: the rendered prompts and their token ids must be identical, the
largest |logit difference| must stay under the tolerance of the quant type, and the greedy answers are compared.
This catches a wrong Q/K permutation, a lost tensor, a bad vocabulary or a missing template - each of which
would otherwise only show as a model that talks nonsense in Ollama."""
from __future__ import annotations

import logging
import os

from roctune import rundir
from roctune.data.render import render_prompt
from roctune.errors import RoctuneError
from roctune.progress import counted

logger = logging.getLogger(__name__)

# Max |logit difference| allowed against the fp32 merged model, per quant type. Measured on the bundled
# SmolLM2-135M after the identity fine-tune (logits span about +-30): f16 0.035, q8_0 1.16 (1.32 on the base
# model; one 8-bit scale per 32 weights across 30 layers). bf16 was not measured: its 8-bit mantissa rounds
# each weight by up to 0.4%, the same order as q8_0's step, so it gets q8_0's tolerance. The tolerances leave
# 2-7x room over the measured drift.
TOLERANCE = {"f16": 0.25, "bf16": 3.0, "q8_0": 3.0}
KQUANT_TOLERANCE = 8.0  # 2-6 bit weights: the check still catches a broken file, not small drift
N_PROMPTS = 3
NEW_TOKENS = 16


def check_prompts(run: str, n: int = N_PROMPTS) -> list[list[dict]]:
    """The first `n` prompts of the run's training data (each conversation up to its last answer); the merge's
    fixed prompts when the data is not readable any more."""
    from roctune.merge import CHECK_PROMPTS

    data = rundir.read_run(run)["config"].get("data") if rundir.is_run_dir(run) else None
    try:
        from roctune.data.records import load_records

        records = load_records(data, limit=n) if data else []
    except RoctuneError as e:
        logger.warning("training data not readable (%s); checking on fixed prompts", e)
        records = []
    prompts = []
    for r in records:
        last = max(i for i, m in enumerate(r.messages) if m["role"] != "assistant") if r.messages else -1
        if last >= 0:
            prompts.append(r.messages[:last + 1])
    return prompts or [list(p) for p in CHECK_PROMPTS]


def verify(merged_dir: str, gguf_dir: str, gguf_name: str, quant: str, prompts: list[list[dict]],
           log=lambda *_: None) -> dict:
    """Compare the GGUF with the merged model, counting the prompts through `log` when it takes a while; raise
    when it is off, return the figures otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        ref = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
        ref_tok = AutoTokenizer.from_pretrained(merged_dir)
        got = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
        got_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    except Exception as e:  # a file transformers cannot read is exactly what this check is for
        raise RoctuneError(f"the written {gguf_name} cannot be read back ({type(e).__name__}: {e}); not saved") from None
    finally:
        hf_logging.enable_progress_bar()
    max_diff, answers, runs = 0.0, [], []
    for msgs in counted(prompts, "checking gguf prompt", log):
        text = render_prompt(ref_tok, msgs)
        if render_prompt(got_tok, msgs) != text:
            raise RoctuneError(f"the chat template in {gguf_name} renders a prompt differently; not saved")
        ids = ref_tok(text, return_tensors="pt", add_special_tokens=False)
        if got_tok(text, add_special_tokens=False)["input_ids"] != ids["input_ids"][0].tolist():
            raise RoctuneError(f"the tokenizer in {gguf_name} splits a prompt differently; not saved")
        with torch.no_grad():
            a, b = ref(**ids).logits, got(**ids).logits
            max_diff = max(max_diff, float((a - b).abs().max()))
            outs = [m.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=ref_tok.eos_token_id)
                    for m in (ref, got)]
        n = ids["input_ids"].shape[1]
        answers.append([ref_tok.decode(o[0, n:], skip_special_tokens=True) for o in outs])
        runs.append((ids["input_ids"][0].tolist(), a[0, -1].numpy(), outs[0][0, n:].tolist()))
    tol = TOLERANCE.get(quant, KQUANT_TOLERANCE)
    equal = sum(x == y for x, y in answers)
    report = {"quant": quant, "prompts": len(prompts), "max_abs_logit_diff": round(max_diff, 4), "tolerance": tol,
              "answers_equal": equal, "answers": [{"merged": x, "gguf": y} for x, y in answers]}
    if max_diff > tol:
        raise RoctuneError(f"{gguf_name} differs from the merged model by max |logit| {max_diff:.3g} (> {tol:g} "
                           f"for {quant}); not saved")
    from roctune.export import llamacpp

    if llamacpp.available():
        report["llama_cpp"] = by_llama_cpp(os.path.join(gguf_dir, gguf_name), runs, ref_tok, tol)
    return report


def by_llama_cpp(path: str, runs: list, tok, tol: float) -> dict:
    """The consumer's own check: llama.cpp loads the file, its logits after each prompt (the same token ids) are
    within `tol` of the merged model's, and its greedy answer (to its end-of-generation token) is compared."""
    from roctune.export import llamacpp

    model = llamacpp.Model(path)
    try:
        max_diff, answers = 0.0, []
        for ids, ref_logits, ref_new in runs:
            logits, new = model.run(ids, NEW_TOKENS)
            max_diff = max(max_diff, float(abs(logits - ref_logits).max()))
            eos = tok.eos_token_id
            ref_new = ref_new[:ref_new.index(eos)] if eos in ref_new else ref_new
            answers.append({"merged": tok.decode(ref_new), "llama_cpp": tok.decode(new), "equal": new == ref_new})
    finally:
        model.close()
    if max_diff > tol:
        raise RoctuneError(f"llama.cpp's logits for {os.path.basename(path)} differ from the merged model's by "
                           f"{max_diff:.3g} (> {tol:g}); not saved")
    return {"max_abs_logit_diff": round(max_diff, 4), "answers_equal": sum(a["equal"] for a in answers),
            "answers": answers}


def summary(report: dict) -> str:
    text = (f"fidelity check ({report['quant']}, {report['prompts']} prompts from the training data): max |logit "
            f"difference| {report['max_abs_logit_diff']:.3g} (tolerance {report['tolerance']:g}), greedy answers "
            f"equal {report['answers_equal']}/{report['prompts']}")
    if "llama_cpp" in report:
        c = report["llama_cpp"]
        text += (f"; in llama.cpp itself: max |logit difference| {c['max_abs_logit_diff']:.3g}, greedy answers "
                 f"equal {c['answers_equal']}/{report['prompts']}")
    return text


def size_text(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.1f} MiB"
