"""Merge a LoRA adapter into its base model and save a plain transformers model (no PEFT needed to load it).
Before saving, the merged model's logits are compared with the adapter model's on a few prompts; a
difference above the tolerance stops the merge. A vision-language model's adapter (LoRA on the language model, and on
the vision tower or projector when they were trained) merges the same way, is checked on prompts with a picture too,
and is saved with its processor: the folder loads with AutoModelForImageTextToText and AutoProcessor."""
from __future__ import annotations

import json
import os

from roctune import rundir
from roctune.data.render import render_prompt
from roctune.errors import ConfigError, EnvironmentProblem, RoctuneError
from roctune.progress import counted

MARKER = "roctune_merge.json"  # written into every merged directory: --overwrite replaces only such a directory

CHECK_PROMPTS = [
    [{"role": "user", "content": "Who are you?"}],
    [{"role": "user", "content": "你是谁？"}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
]


def image_check_prompts() -> list[list[dict]]:
    """A vision model's check prompts: a question about a fixed picture (through the vision tower and projector,
    where vision-side LoRA acts), then the text ones."""
    from roctune.data.images import probe_image

    picture = {"type": "image", "image": probe_image()}
    return [[{"role": "user", "content": [picture, {"type": "text", "text": "What is in this picture?"}]}],
            *CHECK_PROMPTS]


def check_output(adapter: str, output: str, overwrite: bool, marker: str = MARKER,
                 writer: str = "roctune merge") -> None:
    """The output never replaces what `writer` did not write (no `marker` file), nor the run it comes from.
    `roctune export` checks its folder with its own marker."""
    out, src = os.path.realpath(output), os.path.realpath(adapter)
    if out == src or src.startswith(out + os.sep) or out.startswith(src + os.sep):
        raise ConfigError(f"--output {output}: must be outside --adapter {adapter} (and not contain it); choose "
                          "another directory")
    parent = os.path.dirname(out)
    while not os.path.exists(parent):  # missing folders are made when the output is written
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ConfigError(f"--output {output}: {parent} is not a writable folder; choose another --output")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--output {output}: exists and is not a directory; choose another --output")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise ConfigError(f"--output {output} is not empty; use --overwrite (for a previous {writer}) or "
                              "another directory")
        if not os.path.isfile(os.path.join(out, marker)):
            raise ConfigError(f"--output {output} holds files that {writer} did not write; --overwrite only "
                              f"replaces a previous {writer}: choose an empty or new directory")


def merge(adapter: "str | rundir.Run", output: str, dtype: str = "fp32", overwrite: bool = False, log=print) -> dict:
    """Merge the run `adapter` (a rundir.Run or its folder) into its base and save the result in `output`."""
    import torch

    from roctune.generate import load_for_inference

    run = rundir.open(adapter) if isinstance(adapter, str) else adapter
    rundir.refuse_scorer(run, command="merge")
    adapter = run.path
    check_output(adapter, output, overwrite)
    processor = None  # a vision model's: saved beside the merged weights
    if run.whole_model:
        raise RoctuneError(f"--adapter {adapter}: this {run.method.name} run saved a whole model, not an adapter; "
                           "there is nothing to merge (load the directory itself with from_pretrained)")
    if run.method.quantized:
        _refuse_vision_qlora(run)
        run.checked()  # the adapter and its weights, before anything loads
        # trained on 4-bit weights: merge into those weights dequantized to `dtype`, never into 4-bit ones,
        # and check against the model as trained (4-bit base + adapter)
        from roctune.models import load_tokenizer, resolve_model

        base = resolve_model(run.base_model)
        trust = False  # trust_remote_code never comes from a file
        tok = load_tokenizer(run.tokenizer_source(base), trust, run.template)
        enc = [tok(render_prompt(tok, p), return_tensors="pt", add_special_tokens=False) for p in CHECK_PROMPTS]
        log(f"{run.method.name} adapter: loading {base} in 4-bit as in training, then dequantizing it to {dtype} to "
            "merge")
        merged, before, after = dequantized_merge(run, base, dtype, enc, trust, log)
    else:
        from roctune.generate import model_inputs

        loaded = load_for_inference(run, device="cpu", dtype=dtype)
        model, tok, processor = loaded.model, loaded.tokenizer, loaded.processor
        prompts = image_check_prompts() if processor is not None else CHECK_PROMPTS
        enc = [model_inputs(loaded, [p]) for p in prompts]
        with torch.no_grad():
            before = [model(**e).logits.float() for e in enc]
            merged = merge_and_unload(model, log)
            after = [merged(**e).logits.float() for e in enc]
    max_diff = max(float((a - b).abs().max()) for a, b in zip(after, before))
    tol = 1e-3 if dtype == "fp32" else 5e-2
    log(f"merge check: max |logit difference| between adapter and merged model = {max_diff:.2e} (tolerance {tol:g})")
    if max_diff > tol:
        raise RoctuneError(f"merged model differs from the adapter model by {max_diff:.3g} (> {tol:g}); not saved")
    def fill(tmp: str) -> None:
        from roctune.models import hf_progress_off

        with hf_progress_off():
            merged.save_pretrained(tmp)
        (processor or tok).save_pretrained(tmp)  # a processor saves its tokenizer and chat template too
        with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
            json.dump({"adapter": os.path.abspath(adapter), "dtype": dtype, "max_logit_diff": max_diff}, f)

    rundir.write_dir_atomically(output, fill)
    auto = "AutoModelForImageTextToText and AutoProcessor" if processor is not None else "AutoModelForCausalLM"
    log(f"merged model saved to {output} (loads with {auto}.from_pretrained)")
    return {"max_logit_diff": max_diff, "output": output}


def _refuse_vision_qlora(run: rundir.Run) -> None:
    from roctune.generate import is_vision_model
    from roctune.models import resolve_model

    if is_vision_model(resolve_model(run.base_model)):
        raise ConfigError(f"--adapter {run.path}: merging a {run.method.name} adapter of a vision-language model is "
                          "not supported yet; train it with --method lora to merge and export it")


def merge_and_unload(model, log):
    """peft's merge_and_unload, with a count of the adapted layers merged (`merging layer 120/210  eta 0:09`): each
    layer is merged here first, so merge_and_unload finds them merged and only unloads (and handles
    modules_to_save and tied embeddings as usual)."""
    import warnings

    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in counted(layers, "merging layer", log):
        layer.merge()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All adapters are already merged")
        return model.merge_and_unload()


def dequantized_merge(run: "rundir.Run", base_model: str, dtype: str, prompts_enc: list,
                      trust_remote_code: bool = False, log=lambda *_: None):
    """Merge a QLoRA adapter the way it was trained: load the base in 4-bit exactly as in training, run the
    check prompts through base+adapter, dequantize the 4-bit weights into `dtype` (never merging into 4-bit
    weights), merge the adapter there and run the prompts again. Returns (merged_model, before, after)."""
    import torch

    from roctune.hardware import Choice, torch_dtype
    from roctune.methods.qlora import bitsandbytes_problem, load_4bit
    from roctune.models import fit_attention, load_adapter

    problem = bitsandbytes_problem("cpu")
    if problem:
        raise EnvironmentProblem(problem.replace(f"--method {run.method.name}", "merging a QLoRA adapter"))
    attn = fit_attention(Choice("sdpa", "the CPU's kernel"), "auto", base_model).value
    base4 = load_4bit(base_model, dtype, "cpu", attn, trust_remote_code, run.rope_scaling)
    model = load_adapter(base4, run.path)
    model.eval()
    with torch.no_grad():
        before = [model(**e).logits.float() for e in prompts_enc]
    base = model.unload()  # the 4-bit base again, adapter layers removed (nothing merged into 4-bit)
    base = base.dequantize(dtype=torch_dtype(dtype)) or base
    base = base.to(torch_dtype(dtype))
    if hasattr(base.config, "quantization_config"):
        del base.config.quantization_config
    base.hf_quantizer = None
    base.is_quantized = False
    merged = merge_and_unload(load_adapter(base, run.path), log)
    merged.eval()
    with torch.no_grad():
        after = [merged(**e).logits.float() for e in prompts_enc]
    return merged, before, after
