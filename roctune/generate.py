"""Generation shared by chat, generate, merge checks, serve and the web UI. Prompts are rendered by
`roctune.data.render.render_prompt`, the same function training uses to build its examples."""
from __future__ import annotations

import os
from dataclasses import dataclass

from roctune import rundir
from roctune.data.render import render_prompt
from roctune.errors import RoctuneError


@dataclass
class Loaded:
    model: object  # a PeftModel when an adapter is loaded, else the base model
    tokenizer: object
    base_model: str
    adapter: str | None
    device: str


def load_for_inference(adapter: str | None = None, model: str | None = None, device: str = "auto",
                       dtype: str = "auto", trust_remote_code: bool = False, template: str | None = None) -> Loaded:
    """Load a base model (from the adapter's run.yaml unless `model` is given) and the adapter on top.
    The run directory of a freeze/full training holds a whole model: it is loaded as the model itself. The chat
    template is the one the run was trained with (run.yaml), else `template`, else the model's own."""
    from roctune.hardware import choose_attention, choose_device, choose_dtype
    from roctune.models import fit_attention, load_model, load_tokenizer, resolve_model

    base_name = model
    if adapter and rundir.stage(adapter) == "rm":
        raise RoctuneError(f"--adapter {adapter}: a reward model (--stage rm) scores answers and does not write "
                           "them; use it with roctune eval --adapter RUN --data pairs.jsonl, or as --reward-model RUN")
    template = (rundir.template_name(adapter) if adapter else None) or template
    if adapter is not None and model is None:
        if os.path.isdir(adapter) and rundir.is_full_model_dir(adapter):
            # a freeze/full run saved the whole model: load it directly, with no adapter on top
            base_name, adapter = adapter, None
    if adapter is not None:
        if not os.path.isdir(adapter):
            raise RoctuneError(f"--adapter {adapter}: no such directory")
        rundir.check_adapter(adapter, f"--adapter {adapter}")  # a damaged adapter fails here with one line
        if base_name is None:
            # trust_remote_code is never taken from run.yaml: only the caller's own flag counts
            base_name = rundir.read_run(adapter).get("base_model")
    base = resolve_model(base_name)
    dev = choose_device(device).value
    dt = choose_dtype(dtype, dev).value
    attn = fit_attention(choose_attention("auto", dev, dt), "auto", base).value
    if attn == "flash_attention_2":
        attn = "sdpa"  # generation with padding-left batches: sdpa is the safe kernel everywhere
    tok_source = adapter if adapter and os.path.isfile(os.path.join(adapter, "tokenizer_config.json")) else base
    tokenizer = load_tokenizer(tok_source, trust_remote_code, template)
    m = None
    if adapter is not None:
        from roctune.methods import bitsandbytes_problem, load_4bit

        if rundir.method(adapter) == "qlora" and bitsandbytes_problem(dev) is None:
            # answer with the model as trained (4-bit base + adapter), as `roctune merge` also checks against
            m = load_4bit(base, dt, dev, attn, trust_remote_code, rundir.rope_scaling(adapter))
    if m is None:
        m = load_model(base, dt, dev, attn, trust_remote_code, rundir.rope_scaling(adapter))
    if adapter is not None:
        from roctune.models import load_adapter

        m = load_adapter(m, adapter)
    m.eval()
    return Loaded(m, tokenizer, base, adapter, dev)


def _sampling_kwargs(temperature: float, top_p: float) -> dict:
    if temperature and temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_p": top_p}
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


def generate(loaded: Loaded, messages_list: list[list[dict]], max_new_tokens: int = 128, temperature: float = 0.0,
             top_p: float = 1.0, use_adapter: bool = True, streamer=None) -> list[str]:
    """Answer a batch of conversations (left-padded). `use_adapter=False` answers with the base model
    without loading it twice (PEFT's disable_adapter)."""
    import contextlib

    import torch

    from roctune.models import stop_token_ids

    tok = loaded.tokenizer
    prompts = [render_prompt(tok, msgs) for msgs in messages_list]
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(loaded.device)
    ctx = contextlib.nullcontext()
    if not use_adapter and hasattr(loaded.model, "disable_adapter"):
        ctx = loaded.model.disable_adapter()
    with ctx, torch.inference_mode():
        out = loaded.model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                    eos_token_id=stop_token_ids(loaded.model, tok), streamer=streamer,
                                    **_sampling_kwargs(temperature, top_p))
    new = out[:, enc["input_ids"].shape[1]:]
    return [tok.decode(row, skip_special_tokens=True).strip() for row in new]
