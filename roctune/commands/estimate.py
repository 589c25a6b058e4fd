"""`roctune estimate`: how much GPU memory a fine-tuning run needs, from the model's config alone (no weights
are loaded), whether it fits a GPU, and the smallest changes that make it fit."""
from __future__ import annotations

import argparse
import os

from roctune import config
from roctune.config import check_number

# The settings estimate shares with `roctune train`: flags, types, choices, help and defaults from the schema.
SHARED = ("method", "batch_size", "lora_r", "lora_dropout", "dtype", "attn", "grad_checkpointing", "offload",
          "train_vision_tower", "vision_tower_lora", "train_projector", "image_max_pixels", "image_min_pixels")


def register(sub) -> None:
    p = sub.add_parser("estimate", help="estimate the memory a training run needs and whether it fits a GPU",
                       description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="SmolLM2-135M-Instruct",
                   help="local model dir, config.json, hub id in the local cache, or a built-in name "
                        "(see --list-models)")
    config.add_flags(p, SHARED, defaults={})
    p.add_argument("--max-length", default="512", metavar="N|auto",
                   help="tokens per example; auto: the longest that fits the GPU (--gpu/--vram/detected) or, with "
                        "--device cpu, this machine's RAM")
    p.add_argument("--target-modules", nargs="+", metavar="NAME", default=None,
                   help="modules to adapt (default: the model family's attention projections) or all-linear")
    p.add_argument("--freeze-layers", type=int, default=2, help="--method freeze: last layers trained")
    p.add_argument("--optimizer", choices=["adamw", "adamw8bit", "sgd"], default="adamw")
    p.add_argument("--images", type=int, default=None, metavar="N",
                   help="a vision-language model: images per example (default 1); their tokens, from the model's "
                        "processor at --image-max-pixels, are part of --max-length")
    p.add_argument("--supervised-fraction", type=float, default=1.0,
                   help="share of positions where logits are computed (roctune's trainer computes them only "
                        "at trained positions: e.g. 0.3 for short answers after long prompts)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (NVIDIA or AMD ROCm) adds GPU context/allocator overhead; cpu estimates the training "
                        "process's peak RSS")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu", metavar="NAME", help='GPU from the built-in table, e.g. "7900xtx", "mi300x", "rtx 4090"')
    g.add_argument("--vram", type=float, metavar="GB", help="GPU memory in GB as printed on the card (GiB)")
    p.add_argument("--no-detect", action="store_true", help="do not look for a GPU on this machine")
    p.add_argument("--suggest", action="store_true", help="also print the largest batch size and length that fit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--list-gpus", action="store_true", help="list the built-in GPU table and exit")
    p.add_argument("--list-models", action="store_true", help="list the built-in model configs and exit")
    p.set_defaults(func=run)


def check_args(args) -> None:
    """Every number, by the same rules as `roctune train`'s settings where the flag is one of them."""
    from roctune.config import check_number, check_settings
    from roctune.errors import ConfigError

    if str(args.max_length).strip().lower() == "auto":
        args.max_length = "auto"
    else:
        try:
            args.max_length = int(args.max_length)
        except ValueError:
            raise ConfigError(f"--max-length {args.max_length!r}: expected a number of tokens or auto") from None
    check_settings(args, ("batch_size", "lora_r", "lora_dropout") + (() if args.max_length == "auto"
                                                                      else ("max_length",)))
    check_number("--supervised-fraction", args.supervised_fraction, gt=0, le=1)
    check_number("--vram", args.vram, gt=0, le=1 << 20)  # GB; beyond a petabyte is a typo, and int() of inf fails


def _gpu(args) -> tuple[str | None, int | None]:
    from roctune.hardware import detected_gpu, gpu_memory_bytes, gpu_name
    from roctune.memory import GiB

    if args.gpu:
        return gpu_name(args.gpu), gpu_memory_bytes(args.gpu)
    if args.vram is not None:
        return f"{args.vram:g} GB", int(args.vram * GiB)
    if args.device == "cuda" and not args.no_detect:
        found = detected_gpu()
        if found:
            return f"{found[0]} (detected)", found[1]
    return None, None


def run(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from roctune import hardware, memory
    from roctune.memory.fit import fit_kwargs
    from roctune.memory.plan import estimate_run

    check_args(args)
    console = Console()
    if args.list_gpus:
        t = Table(title="built-in GPU table")
        t.add_column("GPU")
        t.add_column("memory (GiB)", justify="right")
        for name, gib in hardware.GPU_MEMORY_GIB.items():
            t.add_row(name, "shared: half of system RAM" if gib is None else f"{gib:g}")
        console.print(t)
        return 0
    if args.list_models:
        t = Table(title="built-in model configs (work offline)")
        for c in ("name", "type", "layers", "hidden", "heads/kv", "vocab", "parameters"):
            t.add_column(c, justify="left" if c in ("name", "type") else "right")
        for name in memory.builtin_model_names():
            a = memory.Architecture.from_config(name)
            t.add_row(name, a.model_type, str(a.layers), str(a.hidden), f"{a.heads}/{a.kv_heads}", f"{a.vocab:,}",
                      f"{a.total_params / 1e9:.2f} B")
        console.print(t)
        return 0

    gpu, vram = _gpu(args)
    if args.device == "cpu" and vram is None:
        vram = hardware.system_memory_bytes()
        gpu = "this machine's RAM" if vram else None
    cfg = _train_settings(args)
    arch = memory.Architecture.from_config(args.model)
    if args.max_length == "auto":
        return _auto_length(arch, cfg, args, gpu, vram, console)
    est = estimate_run(arch, cfg, device=args.device, supervised_fraction=args.supervised_fraction,
                       **_vision(args, cfg))
    kwargs = fit_kwargs(est)
    fixes = memory.fit_suggestions(arch, vram, **kwargs) if vram is not None and not est.fits(vram) else []
    largest = memory.largest_fitting(arch, vram, **kwargs) if vram is not None and args.suggest else None

    if args.json:
        out = est.to_dict()
        out["gpu"] = None if vram is None else {"name": gpu, "memory_bytes": vram, "fits": est.fits(vram),
                                                "headroom_bytes": vram - est.total_bytes}
        out["fixes"] = [{"change": f.change, "total_bytes": f.total_bytes, "settings": f.settings} for f in fixes]
        if largest is not None:
            out["largest_fitting"] = largest
        print(json.dumps(out, indent=2))
        return 0

    GiB = memory.GiB
    console.print(est.format_table())
    for note in est.notes:
        console.print(f"note: {note}")
    if vram is None:
        console.print("no GPU given or detected: pass --gpu NAME or --vram GB to check the fit")
        return 0
    if est.fits(vram):
        console.print(f"[green]fits[/green] {gpu} ({vram / GiB:.1f} GiB): {est.total_bytes / GiB:.1f} GiB estimated, "
                      f"{(vram - est.total_bytes) / GiB:.1f} GiB to spare")
    else:
        console.print(f"[red]does not fit[/red] {gpu} ({vram / GiB:.1f} GiB): {est.total_bytes / GiB:.1f} GiB "
                      "estimated")
        if fixes:
            console.print("smallest changes that make it fit:")
            for f in fixes:
                console.print(f"  {f.change}  ->  {f.total_bytes / GiB:.1f} GiB")
        else:
            console.print("no simple change makes it fit: use a smaller model or a GPU with more memory")
    if largest is not None:
        b, l = largest["batch_size"], largest["max_length"]
        console.print(f"largest batch size at --max-length {largest['at_max_length']}: "
                      f"{b if b is not None else 'none (even batch 1 does not fit)'}")
        console.print(f"largest --max-length at --batch-size {largest['at_batch_size']}: "
                      f"{l if l is not None else 'none (even length 1 does not fit)'}")
    return 0


def _vision(args, cfg) -> dict:
    """estimate_run's vision arguments: a vision-language model's folder and images per example; --images for a
    text model, or more image tokens than --max-length holds, is refused."""
    from roctune.errors import ConfigError
    from roctune.vision import vision_row

    check_number("--images", args.images, ge=0, le=1024)
    folder = args.model if os.path.isdir(os.path.expanduser(args.model)) else None
    if folder is None or vision_row(folder) is None:
        if args.images:
            raise ConfigError(f"--images: {args.model} is not a vision-language model (a local folder whose family has "
                              "a vision tower); drop --images")
        return {}
    from roctune.memory.vision import vision_shape

    images = 1 if args.images is None else args.images
    per = vision_shape(folder, cfg.image_max_pixels, cfg.image_min_pixels).tokens_per_image
    if isinstance(args.max_length, int) and images * per >= args.max_length:
        raise ConfigError(f"--max-length {args.max_length} cannot hold {images} image(s) of {per} tokens each "
                          f"(--image-max-pixels {cfg.image_max_pixels}); raise --max-length or lower the pixels")
    return {"images": images, "vision_model": folder}


def _train_settings(args):
    """The flags as the settings `roctune train` would run with (the names roctune.memory.plan.estimate_run reads)."""
    from types import SimpleNamespace

    return SimpleNamespace(method=args.method, batch_size=args.batch_size, max_length=args.max_length,
                           lora_r=args.lora_r, lora_dropout=args.lora_dropout, target_modules=args.target_modules,
                           freeze_trainable_layers=args.freeze_layers, dtype=args.dtype, attn=args.attn,
                           grad_checkpointing=args.grad_checkpointing, grad_accum=1, optimizer=args.optimizer,
                           loss_on_supervised_only=True, offload=args.offload,
                           train_vision_tower=args.train_vision_tower,
                           vision_tower_lora=args.vision_tower_lora,
                           train_projector=args.train_projector, image_max_pixels=args.image_max_pixels,
                           image_min_pixels=args.image_min_pixels)


def _auto_length(arch, cfg, args, where, memory_bytes, console) -> int:
    """`--max-length auto`: the longest length whose estimate (train's plan for that length) fits."""
    import json

    from roctune.errors import ConfigError
    from roctune.memory import GiB
    from roctune.memory.plan import estimate_run, longest_length

    if memory_bytes is None:
        raise ConfigError("--max-length auto needs the memory to fit: pass --gpu NAME or --vram GB (or --device cpu)")
    best = longest_length(arch, cfg, memory_bytes, device=args.device, supervised_fraction=args.supervised_fraction)
    est = estimate_run(arch, cfg, device=args.device, max_length=best, supervised_fraction=args.supervised_fraction) if best else None
    if args.json:
        print(json.dumps({"max_length": best, "memory_bytes": memory_bytes, "where": where,
                          "estimate": est.to_dict() if est else None}, indent=2))
        return 0
    if best is None:
        console.print(f"even 64 tokens do not fit {where} ({memory_bytes / GiB:.1f} GiB)")
        return 0
    console.print(est.format_table())
    for note in est.notes:
        console.print(f"note: {note}")
    console.print(f"longest --max-length that fits {where} ({memory_bytes / GiB:.1f} GiB): {best:,} tokens "
                  f"(batch {args.batch_size}, {est.total_bytes / GiB:.2f} GiB estimated)")
    if arch.max_positions and best > arch.max_positions:
        console.print(f"note: beyond {arch.name}'s native context of {arch.max_positions:,} tokens")
    return 0
