"""Merge a LoRA adapter into its base model and save a plain transformers model (no PEFT needed to load it).
Before saving, the merged model's logits are compared with the adapter model's on a few prompts; a
difference above the tolerance stops the merge."""
from __future__ import annotations

import os
import shutil
import tempfile

from roctune.data.render import render_prompt
from roctune.errors import RoctuneError

CHECK_PROMPTS = [
    [{"role": "user", "content": "Who are you?"}],
    [{"role": "user", "content": "你是谁？"}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
]


def merge(adapter: str, output: str, dtype: str = "fp32", overwrite: bool = False, log=print) -> dict:
    import torch

    from roctune.generate import load_for_inference

    if os.path.exists(output) and os.listdir(output) and not overwrite:
        raise RoctuneError(f"--output {output} is not empty; use --overwrite or another directory")
    from roctune.methods import dequantized_merge, is_full_model_dir, run_method

    method = run_method(adapter) if os.path.isdir(adapter) else "lora"
    if os.path.isdir(adapter) and is_full_model_dir(adapter):
        raise RoctuneError(f"--adapter {adapter}: this {method} run saved a whole model, not an adapter; there is "
                           "nothing to merge (load the directory itself with from_pretrained)")
    if method == "qlora":
        # trained on 4-bit weights: merge into those weights dequantized to `dtype`, never into 4-bit ones,
        # and check against the model as trained (4-bit base + adapter)
        from roctune.models import load_tokenizer, resolve_model
        from roctune.train import read_run_yaml

        run = read_run_yaml(adapter)
        base = resolve_model(run.get("base_model"))
        trust = bool(run.get("config", {}).get("trust_remote_code"))
        tok_src = adapter if os.path.isfile(os.path.join(adapter, "tokenizer_config.json")) else base
        tok = load_tokenizer(tok_src, trust)
        enc = [tok(render_prompt(tok, p), return_tensors="pt", add_special_tokens=False) for p in CHECK_PROMPTS]
        log(f"qlora adapter: loading {base} in 4-bit as in training, then dequantizing it to {dtype} to merge")
        merged, before, after = dequantized_merge(adapter, base, dtype, enc, trust)
    else:
        loaded = load_for_inference(adapter=adapter, device="cpu", dtype=dtype)
        model, tok = loaded.model, loaded.tokenizer
        enc = [tok(render_prompt(tok, p), return_tensors="pt", add_special_tokens=False) for p in CHECK_PROMPTS]
        with torch.no_grad():
            before = [model(**e).logits.float() for e in enc]
            merged = model.merge_and_unload()
            after = [merged(**e).logits.float() for e in enc]
    max_diff = max(float((a - b).abs().max()) for a, b in zip(after, before))
    tol = 1e-3 if dtype == "fp32" else 5e-2
    log(f"merge check: max |logit difference| between adapter and merged model = {max_diff:.2e} (tolerance {tol:g})")
    if max_diff > tol:
        raise RoctuneError(f"merged model differs from the adapter model by {max_diff:.3g} (> {tol:g}); not saved")
    parent = os.path.dirname(os.path.abspath(output)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-merge-", dir=parent)
    try:
        merged.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if os.path.isdir(output):
            shutil.rmtree(output)
        os.rename(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"merged model saved to {output} (loads with AutoModelForCausalLM.from_pretrained)")
    return {"max_logit_diff": max_diff, "output": output}
