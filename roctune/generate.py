"""Generation shared by chat, generate, merge checks, serve and the web UI. Prompts are rendered by
`roctune.data.render.render_prompt`, the same function training uses to build its examples."""
from __future__ import annotations

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


def load_for_inference(adapter: "str | rundir.Run | None" = None, model: str | None = None, device: str = "auto",
                       dtype: str = "auto", trust_remote_code: bool = False, template: str | None = None) -> Loaded:
    """Load a base model (the run's, from run.yaml, unless `model` is given) and the run's adapter on top;
    `adapter` is a run (rundir.open) or its folder. A run that saved a whole model (freeze/full) is loaded as the
    model itself; a run that scores answers (a reward model) is refused. The chat template is the one the run was
    trained with, else `template`, else the model's own; the base is loaded as its method trained on it."""
    from roctune.hardware import choose_attention, choose_device, choose_dtype
    from roctune.methods import load_trained_base
    from roctune.models import fit_attention, load_model, load_tokenizer, resolve_model

    run = rundir.open(adapter) if isinstance(adapter, str) else adapter
    base_name = model
    if run is not None:
        rundir.refuse_scorer(run)
        template = run.template or template
        if run.whole_model and model is None:  # a freeze/full run saved the whole model: loaded itself, no adapter
            base_name, run = run.path, None
        elif run.whole_model:
            rundir.check_adapter(run.path, run.what)  # --model BASE needs an adapter to put on it
        else:
            run.checked()  # a damaged adapter fails here with one line
            # trust_remote_code is never taken from run.yaml: only the caller's own flag counts
            base_name = base_name or run.base_model
    base = resolve_model(base_name)
    dev = choose_device(device).value
    dt = choose_dtype(dtype, dev).value
    attn = fit_attention(choose_attention("auto", dev, dt), "auto", base).value
    if attn == "flash_attention_2":
        attn = "sdpa"  # generation with padding-left batches: sdpa is the safe kernel everywhere
    tokenizer = load_tokenizer(run.tokenizer_source(base) if run else base, trust_remote_code, template)
    if run is None:
        m = load_model(base, dt, dev, attn, trust_remote_code)
    else:
        from roctune.models import load_adapter

        m = load_adapter(load_trained_base(run.method, base, dt, dev, attn, trust_remote_code, run.rope_scaling),
                         run.path)
    m.eval()
    return Loaded(m, tokenizer, base, run.path if run else None, dev)


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
