"""Generation shared by chat, generate, merge checks, serve and the web UI. Prompts are rendered by
`roctune.data.render.render_prompt`, the same function training uses to build its examples.

A vision-language model (its config has a vision tower) loads with transformers' AutoModelForImageTextToText and its
AutoProcessor; a conversation's images are content parts (roctune.data.parts), rendered by the chat template as the
model's image placeholder and expanded into the image's tokens by the processor, with the pixel values beside the
token ids."""
from __future__ import annotations

import os
from dataclasses import dataclass

from roctune import rundir
from roctune.data.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
from roctune.data.render import render_prompt
from roctune.errors import RoctuneError


@dataclass
class Loaded:
    model: object  # a PeftModel when an adapter is loaded, else the base model
    tokenizer: object
    base_model: str
    adapter: str | None
    device: str
    processor: object = None  # a vision model's processor (images to pixel values and image tokens); None: text only
    image_pixels: tuple[int, int] = (DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS)  # (max, min) for a picture: image_pixels


def image_pixels(run: "str | rundir.Run | None") -> tuple[int, int]:
    """(max, min) pixels a picture is scaled to at inference: the run's --image-max-pixels and --image-min-pixels
    (run.yaml), so the model sees a picture at the size, and with its token count, it trained on; the defaults
    without a run (a base or merged model, a run without images)."""
    run = rundir.open(run) if isinstance(run, str) else run
    if run is None:
        return DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
    return (run.count("image_max_pixels", DEFAULT_MAX_PIXELS),
            run.count("image_min_pixels", DEFAULT_MIN_PIXELS))


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
    pixels = image_pixels(run)
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
    processor = None
    if is_vision_model(base):
        m, processor = load_vision_model(base, dt, dev, attn, trust_remote_code, tokenizer)
    elif run is None:
        m = load_model(base, dt, dev, attn, trust_remote_code)
    else:
        m = load_trained_base(run.method, base, dt, dev, attn, trust_remote_code, run.rope_scaling)
    if run is not None:
        from roctune.models import load_adapter

        m = load_adapter(m, run.path)
    m.eval()
    return Loaded(m, tokenizer, base, run.path if run else None, dev, processor, pixels)


def is_vision_model(path: str) -> bool:
    """Whether the model folder `path` is a vision-language model's: its config's family has a vision row
    (roctune.vision.vision_row; read from config.json, nothing loaded)."""
    from roctune.vision import vision_row

    return vision_row(path) is not None


def load_vision_model(path: str, dtype: str, device: str, attn: str, trust_remote_code: bool, tokenizer=None):
    """(model, processor) of a vision-language model folder, loaded as training loads it (roctune.vision); the
    processor renders with `tokenizer` (the one whose chat template the run chose) when given."""
    from roctune import vision

    model = vision.load_model(path, dtype, device, attn, trust_remote_code)
    processor = vision.load_processor(path, vision.vision_row(path), trust_remote_code)
    if tokenizer is not None:
        processor.tokenizer = tokenizer
    processor.tokenizer.roctune_content_parts = True  # its template takes content parts, as in training
    return model, processor


def base_of(adapter: str | None, model: str | None) -> str:
    """The base model folder a command will load (the adapter's run.yaml unless `model` is given), resolved
    without loading anything."""
    from roctune.models import resolve_model

    if model is None and adapter:
        run = rundir.open(adapter)
        model = run.path if run.whole_model else run.base_model
    return resolve_model(model)


def require_vision(adapter: str | None, model: str | None, what: str) -> None:
    """Refuse `what` (an image, named by its flag or field) for a model without a vision tower, before any load."""
    base = base_of(adapter, model)
    if not is_vision_model(base):
        raise RoctuneError(f"{what}: {os.path.basename(base.rstrip(os.sep)) or base} is a text-only model (no vision "
                           "tower in its config.json); give a vision-language model or drop the image")


def model_inputs(loaded: Loaded, messages_list: list[list[dict]]):
    """The tensors for a batch of conversations (left-padded): token ids and mask, and for a vision model the
    pixel values of their images (in the order the template places them). The prompt text comes from
    `render_prompt`, as in training."""
    from roctune.data.parts import has_images, take_images

    tok = loaded.tokenizer
    shaped = [take_images(msgs) for msgs in messages_list]
    prompts = [render_prompt(tok, msgs) for msgs, _ in shaped]
    tok.padding_side = "left"
    if loaded.processor is None or not any(has_images(m) for m in messages_list):
        if any(has_images(m) for m in messages_list):
            raise RoctuneError("an image was given to a text-only model; give a vision-language model")
        return tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(loaded.device)
    images = [imgs for _, imgs in shaped]
    enc = loaded.processor(text=prompts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.to(loaded.device)


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

    from roctune.data.parts import has_images
    from roctune.models import stop_token_ids

    if len(messages_list) > 1 and any(has_images(m) for m in messages_list):  # one at a time: images vary in size
        return [a for msgs in messages_list for a in generate(loaded, [msgs], max_new_tokens, temperature, top_p,
                                                              use_adapter, streamer)]
    tok = loaded.tokenizer
    enc = model_inputs(loaded, messages_list)
    ctx = contextlib.nullcontext()
    if not use_adapter and hasattr(loaded.model, "disable_adapter"):
        ctx = loaded.model.disable_adapter()
    with ctx, torch.inference_mode():
        out = loaded.model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                    eos_token_id=stop_token_ids(loaded.model, tok), streamer=streamer,
                                    **_sampling_kwargs(temperature, top_p))
    new = out[:, enc["input_ids"].shape[1]:]
    return [tok.decode(row, skip_special_tokens=True).strip() for row in new]
