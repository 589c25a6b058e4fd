"""Vision-language models: their processor, their weights, and which of their parts train.

A model folder is a vision-language model when its config's model_type is a row of roctune.families with a
`vision` column (Qwen2.5-VL, Qwen3-VL, Gemma 3, SmolVLM, Idefics3, LLaVA, LLaVA-NeXT). It is a standard transformers
folder: it loads with AutoModelForImageTextToText and its processor class (the row's), and a run trained on it is a
run folder like a text run's (adapter + run.yaml), with the processor saved beside the adapter.

The parts come from the row's module paths (`part_of`): the language model trains by --method (LoRA on its attention
by default, freeze, full); the vision tower and the projector stay frozen unless --train-vision-tower /
--train-projector. With LoRA, a trained projector and a trained tower train whole beside the adapter (peft's
modules_to_save: `projector_modules`, `tower_modules`; a freshly built tower must learn from scratch, as nanoVLM's
does), or the tower gets LoRA on its linear layers with --vision-tower-lora (`lora_pattern`; a pretrained tower); with
freeze or full, their weights train (`set_parts_trainable`). roctune.methods builds the model from these.

The processor needs no torchvision: transformers' PIL image processors serve, and where torchvision does not import
(PyPI's wheel beside the CPU torch) the processor is built without its video processor (`processor_class`).
"""
from __future__ import annotations

import functools
import os
import re

from roctune.errors import ConfigError, DataError, ModelError, either
from roctune.families import Vision, vision_of
from roctune.stages import STAGES, able

PARTS = ("tower", "projector", "language")


def vision_row(model) -> Vision | None:
    """The vision column of a model (a folder, a config, or a loaded model); None for a text model."""
    if hasattr(model, "config") and not isinstance(model, (str, dict)):
        model = model.config
    if isinstance(model, str):
        from roctune.memory.configs import load_config

        try:
            model = load_config(model)
        except Exception:  # noqa: BLE001 - an unreadable config is reported where the model loads
            return None
    return vision_of(model)


@functools.lru_cache(maxsize=None)  # one class per name: isinstance checks hold across loads
def processor_class(name: str):
    """transformers' processor class `name`; where torchvision does not import, a subclass that leaves out the video
    processor (transformers' processors of video-capable models require one, and its video processors need
    torchvision): the image path is the same code, and the files it saves are the same (the class keeps its name)."""
    import types

    import transformers
    from transformers.utils import is_torchvision_available

    cls = getattr(transformers, name)
    if "video_processor" not in cls.get_attributes() or is_torchvision_available():
        return cls
    # transformers reads the processor's init arguments from its code object (co_varnames): the subclass keeps
    # the original __init__ code, with a default (None) for video_processor.
    init = cls.__init__
    code = init.__code__
    names = code.co_varnames[:code.co_argcount]
    defaults = init.__defaults__ or ()
    first, at = len(names) - len(defaults), names.index("video_processor")
    defaults = (None,) * max(0, first - at) + defaults
    new_init = types.FunctionType(code, init.__globals__, "__init__", defaults, init.__closure__)
    new_init.__kwdefaults__ = init.__kwdefaults__
    attributes = [a for a in cls.get_attributes() if a != "video_processor"]
    return type(name, (cls,), {"__init__": new_init, "__module__": cls.__module__, "__doc__": cls.__doc__,
                               "get_attributes": classmethod(lambda c: list(attributes))})


def load_processor(path: str, row: Vision, trust_remote_code: bool = False):
    """The model's processor (tokenizer, image processor, chat template) from its folder."""
    from roctune.models import hf_progress_off, refused_remote_code

    try:
        with hf_progress_off(), refused_remote_code(path):
            return processor_class(row.processor).from_pretrained(path, trust_remote_code=trust_remote_code)
    except ModelError:
        raise
    except (OSError, ValueError, TypeError, KeyError, ImportError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ModelError(f"{path}: its processor ({row.processor}) does not load ({first}); a vision model's folder "
                         "needs its processor files (processor_config.json or preprocessor_config.json, the "
                         "tokenizer and chat template)") from None


def load_image_text(path: str, template: str | None = None, max_pixels: int | None = None,
                    min_pixels: int | None = None, trust_remote_code: bool = False):
    """What tokenizing images needs (roctune.data.image_tokens.ImageText): the processor, its tokenizer ready as a
    text model's (chat template chosen, pad token; models.ready_tokenizer) and marked to render content parts."""
    from roctune.data.image_tokens import ImageText
    from roctune.data.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
    from roctune.models import ready_tokenizer

    row = vision_row(path)
    if row is None:
        raise ModelError(f"{path}: not a vision-language model (its config's model_type has no vision row in "
                         "roctune's family table)")
    processor = load_processor(path, row, trust_remote_code)
    tok = ready_tokenizer(processor.tokenizer, path, template)
    tok.roctune_content_parts = True
    processor.chat_template = tok.chat_template  # saved with the processor: the template training rendered with
    return ImageText(processor, max_pixels or DEFAULT_MAX_PIXELS, min_pixels or DEFAULT_MIN_PIXELS, row.token_types)


def tokenizer_for(name: str | None, template: str | None = None, trust_remote_code: bool = False):
    """What reads data for model `name` (data check, data preview): a vision model's ImageText (its processor,
    which counts image tokens), else the model's tokenizer (models.load_tokenizer)."""
    from roctune.models import load_tokenizer, resolve_model

    path = name if name is not None and os.path.isdir(name) else resolve_model(name)  # a tokenizer's folder too
    if vision_row(path) is None:
        return load_tokenizer(path, trust_remote_code, template)
    return load_image_text(path, template, trust_remote_code=trust_remote_code)


def load_model(path: str, dtype: str = "fp32", device: str = "cpu", attn: str = "sdpa",
               trust_remote_code: bool = False, quantization=None):
    """A vision-language model (AutoModelForImageTextToText) onto `device` in `dtype`; with `quantization`
    (methods.qlora_config) its language model's linear layers in 4 bits, the tower, projector and output layer not."""
    from transformers import AutoModelForImageTextToText

    from roctune.hardware import torch_dtype
    from roctune.models import hf_progress_off, refused_remote_code

    kwargs = {}
    if quantization is not None:
        import torch

        row = vision_row(path)
        quantization.llm_int8_skip_modules = [*row.tower, *row.projector, "lm_head"]
        kwargs = {"quantization_config": quantization,
                  "device_map": {"": "cpu" if device == "cpu" else torch.cuda.current_device()}}
    with hf_progress_off(), refused_remote_code(path):
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch_dtype(dtype), attn_implementation=attn, trust_remote_code=trust_remote_code, **kwargs)
    return model if quantization is not None else model.to(device)


def meta_model(path: str, trust_remote_code: bool = False):
    """The model's module tree without weights (meta device), for checking names before loading."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)


# --------------------------------------------------------------------------------------------------- parts
def _under(name: str, paths) -> bool:
    return any(name == p or name.startswith(p + ".") for p in paths)


def part_of(name: str, row: Vision) -> str:
    """Which part a parameter or module belongs to ("tower", "projector" or "language"), by its name in the
    ...ForConditionalGeneration model (a peft wrapper's "base_model.model." prefix is dropped)."""
    name = name.removeprefix("base_model.model.")
    if _under(name, row.projector):
        return "projector"
    return "tower" if _under(name, row.tower) else "language"


def language_model(model, row: Vision):
    """The language model's module (its decoder layers are what --method freeze chooses from)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_submodule(row.language_model)


def count_parts(model, row: Vision) -> dict[str, list[int]]:
    """{part: [trainable parameters, all parameters]}, for the log and the tests."""
    out = {p: [0, 0] for p in PARTS}
    for name, p in model.named_parameters():
        if ".original_module." in name:  # peft's frozen copy of a module trained whole (modules_to_save)
            continue
        entry = out[part_of(name, row)]
        entry[0] += p.numel() if p.requires_grad else 0
        entry[1] += p.numel()
    return out


def describe_parts(model, row: Vision) -> str:
    counts = count_parts(model, row)
    said = [f"{part} {'trains' if t else 'frozen'} ({t:,} of {n:,})" for part, (t, n) in counts.items() if n]
    return "vision model: " + "; ".join(said)


def _linear_names(model, part: str, row: Vision, leaves: list[str] | None = None) -> list[str]:
    import torch

    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and part_of(n, row) == part
            and (leaves is None or n.split(".")[-1] in leaves) and not n.endswith("lm_head")]


def lora_pattern(model, row: Vision, targets: list[str], tower: bool) -> str:
    """peft's target_modules as one regular expression (full match) naming exactly the linear layers LoRA adapts:
    the language model's `targets` (leaf names, or every linear layer for all-linear), and with `tower` every
    linear layer of the vision tower; never the projector (which trains whole) or the output layer. Layer indices
    are folded into \\d+, so the pattern stays short; it is checked to match exactly those modules."""
    wanted = _linear_names(model, "language", row, None if targets == ["all-linear"] else list(targets))
    if tower:
        wanted += _linear_names(model, "tower", row)
    if not wanted:
        raise ConfigError(f"--target-modules {' '.join(targets)}: no linear layer of that name in the language model")
    pattern = "|".join(sorted({re.sub(r"\\\.\d+\\\.", r"\\.\\d+\\.", re.escape(n) + r"\.").removesuffix(r"\.")
                               for n in wanted}))
    pattern = f"^(?:{pattern})$"
    compiled = re.compile(pattern)
    if {n for n, _ in model.named_modules() if compiled.fullmatch(n)} != set(wanted):
        pattern = "^(?:" + "|".join(re.escape(n) for n in wanted) + ")$"  # layers that differ: name each
    return pattern


def projector_modules(model, row: Vision) -> list[str]:
    """The projector's modules as peft's modules_to_save takes them: a list of modules (Qwen3-VL's DeepStack
    mergers, a ModuleList, which peft cannot wrap) as its members."""
    import torch

    out = []
    for path in row.projector:
        module = model.get_submodule(path)
        out += ([f"{path}.{k}" for k, _ in module.named_children()] if isinstance(module, torch.nn.ModuleList)
                else [path])
    return out


def tower_modules(model, row: Vision) -> list[str]:
    """The tower's modules with weights, as peft's modules_to_save takes them (trained whole beside LoRA): the
    tower's children, leaving out the projector parts inside it (Qwen-VL's mergers) and listing a ModuleList's
    members (peft cannot wrap a ModuleList)."""
    import torch

    def walk(path: str) -> list[str]:
        module = model.get_submodule(path)
        if any(p.startswith(path + ".") for p in row.projector) or isinstance(module, torch.nn.ModuleList):
            return [c for name, _ in module.named_children() for c in walk(f"{path}.{name}")
                    if not _under(f"{path}.{name}", row.projector)]
        return [path] if next(module.parameters(), None) is not None else []
    return [m for path in row.tower for m in walk(path)]


def set_parts_trainable(model, row: Vision, tower: bool, projector: bool) -> None:
    """The tower's and projector's weights train or not (freeze and full: after the language model's choice)."""
    for name, p in model.named_parameters():
        part = part_of(name, row)
        if part != "language":
            p.requires_grad_(tower if part == "tower" else projector)


def check(cfg, base_model: str) -> Vision | None:
    """The vision flags against the model, before it loads: on a text model they are refused."""
    row = vision_row(base_model)
    asked = [f for f in ("train_vision_tower", "train_projector") if getattr(cfg, f, False)]
    if row is None and asked:
        raise ConfigError(f"--{asked[0].replace('_', '-')}: {base_model} has no vision tower (a text model); drop "
                          "the flag or give a vision-language model with --model")
    if row is not None and not STAGES[cfg.stage].images:
        raise ConfigError(f"--stage {cfg.stage}: vision-language models train with --stage "
                          f"{either(able('images'))} so far; the other stages with images are not built yet")
    if row is not None and cfg.streaming:
        raise ConfigError("--streaming: a vision-language model's examples (with their images) are tokenized in "
                          "memory; drop --streaming")
    if row is not None and cfg.sequence_parallel > 1:
        raise ConfigError("--sequence-parallel cuts rows into token slices, which would cut image spans; a "
                          "vision-language model trains without it")
    if row is not None and cfg.packing == "on" and not row.packing:
        raise ConfigError(f"--packing on: packed rows with images are not proven for this model family "
                          f"({row.processor}); use --packing off")
    return row


def check_records(groups, base_model: str) -> None:
    """A record with images for a model without vision is refused with its line, before the model loads. `groups`:
    lists of records (or data.records.StreamedRecords, which noted its first record with images when it counted)."""
    if vision_row(base_model) is not None:
        return
    for records in groups:
        where = getattr(records, "with_images", None)
        if where is None and isinstance(records, list):
            where = next((r.source for r in records if getattr(r, "images", None)), None)
        if where is not None:
            raise DataError(f"{where}: the record has images, but {base_model} is a text model (no vision tower); "
                            "give a vision-language model with --model (e.g. one from `roctune models build-vlm`), "
                            "or remove the images")


def body(model):
    """The multimodal body of a ...ForConditionalGeneration model (under peft or not): vision tower, projector
    and language model, returning the final hidden state the output layer reads."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def saved_with_run(folder: str) -> bool:
    """Whether a run folder holds a vision model's processor (saved beside its adapter)."""
    return any(os.path.isfile(os.path.join(folder, n)) for n in ("processor_config.json", "preprocessor_config.json"))
