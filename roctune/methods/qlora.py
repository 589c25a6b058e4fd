"""--method qlora: a LoRA adapter (roctune.methods.lora) on a base model whose linear weights are stored in 4-bit NF4
(bitsandbytes, double quantization) and dequantized on the fly into the training compute dtype.

`bitsandbytes_problem` probes bitsandbytes with a real 4-bit round trip before anything loads (train, doctor's
self-test, merge); `load_4bit` loads a base as training does, and `load_trained_base` loads it so for the commands
that answer with a run (chat, generate, eval, serve), so they answer with the model as trained."""
from __future__ import annotations

from roctune.errors import EnvironmentProblem
from roctune.methods import lora
from roctune.methods.parts import exact_4bit


# ------------------------------------------------------------------------------------------ bitsandbytes
def bitsandbytes_problem(device: str) -> str | None:
    """None when bitsandbytes can quantize to 4 bits on `device` ("cuda" also means ROCm, or "cpu");
    otherwise what is wrong and what to install. It tries a real 4-bit quantization of a small tensor, so a
    wheel without a binary for this backend (or this GPU) is caught here rather than halfway into loading."""
    from roctune.hardware import torch_backend
    from roctune.hardware.install_plan import BNB_PIP

    backend = "cpu" if device == "cpu" else torch_backend()
    label = {"rocm": "ROCm", "cuda": "CUDA", "cpu": "the CPU"}[backend]
    install = {
        "cpu": f"{BNB_PIP} (its wheels include a CPU build)",
        "cuda": f"{BNB_PIP} (its wheels include CUDA builds)",
        "rocm": f"{BNB_PIP} (its wheels include ROCm 6.4+ builds; for an older ROCm, build "
                "bitsandbytes from source with -DCOMPUTE_BACKEND=hip)",
    }[backend]
    try:
        import bitsandbytes  # noqa: F401
        import bitsandbytes.functional as bnbf
    except ImportError:
        return f"--method qlora needs bitsandbytes, which is not installed: {install}; or use --method lora"
    except Exception as e:  # a broken install raises all sorts of things on import
        return (f"--method qlora: bitsandbytes fails to import on {label} ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); reinstall it: {install}; "
                "or use --method lora")
    try:
        import torch

        dev = "cpu" if device == "cpu" else f"cuda:{torch.cuda.current_device()}"
        probe = torch.randn(64, 64, device=dev)
        packed, state = bnbf.quantize_4bit(probe, quant_type="nf4", compress_statistics=True)
        back = bnbf.dequantize_4bit(packed, state)
        if back.shape != probe.shape or not torch.isfinite(back).all():
            raise RuntimeError("4-bit round trip gave wrong values")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"--method qlora: this bitsandbytes ({getattr(bitsandbytes, '__version__', '?')}) has no working "
                f"4-bit build for {label} ({first[:200]}); {install}; or use --method lora")
    return None


def probe(cfg) -> None:
    """Before the model skeleton is even built: a bitsandbytes that cannot quantize here stops the run."""
    from roctune.hardware import choose_device

    problem = bitsandbytes_problem(choose_device(cfg.device).value)
    if problem:
        raise EnvironmentProblem(problem)


check = lora.check  # the adapter's targets and rank, as LoRA's


# ----------------------------------------------------------------------------------------- build models
def qlora_config(dtype: str):
    from transformers import BitsAndBytesConfig

    from roctune.hardware import torch_dtype

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch_dtype(dtype), bnb_4bit_quant_storage="uint8")


def load_4bit(path: str, dtype: str, device: str, attn: str, trust_remote_code: bool = False,
              rope_scaling: str = "", scalar_head: bool = False):
    """Load a causal LM (or with `scalar_head` a reward model, see models.load_model) with 4-bit NF4 linear weights
    (double quantization) computing in `dtype`."""
    import torch

    from roctune.hardware import torch_dtype
    from roctune.models import head_kwargs, model_class, scaled_config

    where = "cpu" if device == "cpu" else torch.cuda.current_device()
    config = scaled_config(path, rope_scaling, trust_remote_code)
    model = model_class(scalar_head).from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation=attn, trust_remote_code=trust_remote_code,
        quantization_config=qlora_config(dtype), device_map={"": where}, **head_kwargs(config, scalar_head))
    return exact_4bit(model, device)


def build(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    """The 4-bit base with a LoRA adapter (fresh, or --adapter DIR) on top."""
    log(f"qlora: base weights in 4-bit NF4 (double quantization), computing in {setup.dtype}")
    model = load_4bit(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code,
                      cfg.rope_scaling, scalar_head)
    return lora.attach_lora(model, cfg, setup.turn_tokens, log, scalar_head)


def build_vision(cfg, setup, base_model: str, log=print):
    """A vision-language model with its language model's linear weights in 4 bits (tower, projector and output
    layer not) and LoRA as roctune.methods.lora puts it."""
    log(f"qlora: the language model's weights in 4-bit NF4, computing in {setup.dtype}; tower and projector not")
    return lora.build_vision(cfg, setup, base_model, log, qlora_config(setup.dtype))


def load_trained_base(path: str, dtype: str, device: str, attn: str, trust_remote_code: bool = False,
                      rope_scaling: str = "", scalar_head: bool = False):
    """The base as the adapter was trained on it (4-bit) for a command that answers or scores with the run; None
    where bitsandbytes cannot run here (the caller loads it unquantized: the adapter's own weights are the same)."""
    if bitsandbytes_problem(device) is not None:
        return None
    return load_4bit(path, dtype, device, attn, trust_remote_code, rope_scaling, scalar_head)
