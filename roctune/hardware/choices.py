"""What this machine can do, for training and inference: device, dtype and attention kernel, each
returned with the reason shown to the user. ROCm and CUDA are one path: PyTorch exposes ROCm through
`torch.cuda` (with `torch.version.hip` set), so the code asks "is there an accelerator" and never
"is this NVIDIA". Facts read from sysfs live in `roctune.hardware.probe`.

`choose_dtype` and `choose_attention` take optional `bf16` / `flash_attn` facts so that `roctune doctor`
can ask the same question about a simulated or remote machine and get the same answer training gets.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from roctune.errors import ConfigError, EnvironmentProblem

# The choices of --device, --dtype and --attn, declared once for every command that takes them.
DEVICES = ("auto", "cuda", "cpu")  # cuda also means AMD ROCm (torch.cuda)
DTYPES = ("auto", "bf16", "fp16", "fp32")
WEIGHT_DTYPES = DTYPES[1:]  # a saved model's dtype (merge, export): no "auto"
ATTENTION = ("auto", "eager", "sdpa", "flash_attention_2")


@dataclass
class Choice:
    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.value} ({self.reason})"


def torch_backend() -> str:
    """'rocm', 'cuda' or 'cpu': what the installed torch was built for."""
    import torch

    if getattr(torch.version, "hip", None):
        return "rocm"
    if getattr(torch.version, "cuda", None):
        return "cuda"
    return "cpu"


def accelerator_name(index: int = 0) -> str:
    import torch

    props = torch.cuda.get_device_properties(index)
    arch = getattr(props, "gcnArchName", "")
    return f"{props.name}{' (' + arch.split(':')[0] + ')' if arch else ''}"


def choose_device(requested: str = "auto") -> Choice:
    import torch

    backend = torch_backend()
    label = "ROCm" if backend == "rocm" else "CUDA"
    if requested == "cpu":
        return Choice("cpu", "asked for with --device cpu")
    if requested not in ("auto", "cuda"):
        raise ConfigError(f"--device {requested!r}: expected auto, cuda or cpu")
    if torch.cuda.is_available():
        return Choice("cuda", f"{label} GPU {accelerator_name(0)}")
    if requested == "cuda":
        if backend == "cpu":
            raise EnvironmentProblem("--device cuda: this torch is a CPU-only build; install the ROCm or CUDA "
                                     "build of torch (see `roctune doctor`), or use --device cpu")
        raise EnvironmentProblem(f"--device cuda: torch is a {label} build but sees no GPU; run `roctune "
                                 "doctor` for the cause and fix, or use --device cpu")
    return Choice("cpu", "no GPU visible to torch (run `roctune doctor` if you expected one)")


def bf16_supported(device: str) -> bool:
    import torch

    if device != "cuda":
        return False
    try:
        return bool(torch.cuda.is_bf16_supported())
    except Exception:  # older builds, odd devices
        return False


def choose_dtype(requested: str, device: str, *, bf16: bool | None = None) -> Choice:
    """bf16 on GPUs that support it, fp16 on other GPUs, fp32 on the CPU.

    On the CPU bf16 matmul is hundreds of times slower than fp32 on machines without AMX/AVX512-BF16,
    so fp32 is the only sensible default there. `bf16`: whether the GPU has bf16, when known without
    asking torch (doctor's facts); None asks the running torch.
    """

    def supported() -> bool:  # asked only where needed: asking torch may initialise the GPU runtime
        return bf16_supported(device) if bf16 is None else (device != "cpu" and bool(bf16))

    if requested not in DTYPES:
        raise ConfigError(f"--dtype {requested!r}: expected one of {', '.join(DTYPES)}")
    if requested != "auto":
        if device == "cpu" and requested in ("bf16", "fp16"):
            return Choice(requested, "asked for; note: on most CPUs half-precision matmul is far slower than fp32")
        if requested == "bf16" and not supported():
            raise EnvironmentProblem("--dtype bf16: this GPU does not support bf16; use --dtype fp16 or auto")
        return Choice(requested, "asked for with --dtype")
    if device == "cpu":
        return Choice("fp32", "CPU: fp32 matmul is far faster than bf16 here")
    if supported():
        return Choice("bf16", "GPU supports bf16")
    return Choice("fp16", "GPU has no bf16 support")


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def choose_attention(requested: str, device: str, dtype: str, *, flash_attn: bool | None = None) -> Choice:
    """flash_attention_2 when installed on a GPU in half precision, else sdpa (PyTorch's fused kernels,
    including AOTriton on ROCm), else eager. `flash_attn`: whether flash-attn is installed, when known
    (doctor's facts); None looks for the package here."""
    installed = flash_attn_available if flash_attn is None else (lambda: bool(flash_attn))
    if requested not in ATTENTION:
        raise ConfigError(f"--attn {requested!r}: expected one of {', '.join(ATTENTION)}")
    if requested == "flash_attention_2":
        if not installed():
            raise EnvironmentProblem("--attn flash_attention_2: the flash-attn package is not installed; "
                                     "install the build for your GPU (ROCm: the ROCm/flash-attention fork) "
                                     "or use --attn sdpa")
        if device == "cpu" or dtype == "fp32":
            raise EnvironmentProblem("--attn flash_attention_2 needs a GPU and --dtype bf16 or fp16; use --attn sdpa")
        return Choice(requested, "asked for with --attn")
    if requested != "auto":
        return Choice(requested, "asked for with --attn")
    if device != "cpu" and dtype != "fp32" and installed():
        return Choice("flash_attention_2", "flash-attn is installed and the GPU runs in half precision")
    if device == "cpu":
        return Choice("sdpa", "PyTorch scaled_dot_product_attention (fastest kernel on the CPU)")
    return Choice("sdpa", "PyTorch scaled_dot_product_attention; flash-attn is not installed")
