"""The one place for facts about the machine: which device, dtype and attention kernel to use (with the
reason), what GPUs, drivers, device nodes and torch build are here, what roctune knows about GPU models
(architectures, overrides, wheel indexes, memory sizes), and `preflight`, which training runs first.

Layering: this package imports only `roctune.errors`; `roctune.doctor`, `roctune.memory` and training
import from here. Nothing here imports torch at import time.

    choices      device / dtype / attention choice with reasons (what training and inference use)
    gpus         AMD architecture table and gfx names        wheels      PyTorch ROCm/CUDA wheel indexes
    gpu_memory   memory sizes of cards by name                probe       sysfs, /dev, /etc, vendor tools
    torchfacts   the installed torch and GPU libraries        facts       Gpu / Machine data
    machine      gather(): all facts of a machine             report      Finding / Report
    readiness    can torch train on this GPU (checks)         preflight   the fast check before training
"""
from roctune.hardware.choices import (Choice, accelerator_name, bf16_supported, choose_attention, choose_device,
                                      choose_dtype, flash_attn_available, torch_backend, torch_dtype)
from roctune.hardware.facts import Gpu, Machine
from roctune.hardware.gpu_memory import GPU_MEMORY_GIB, gpu_memory_bytes, gpu_name
from roctune.hardware.gpus import ARCHS, Arch, gfx_name, parse_override
from roctune.hardware.machine import gather
from roctune.hardware.preflight import preflight
from roctune.hardware.probe import system_memory_bytes
from roctune.hardware.report import ENV_KEYS, Finding, Report
from roctune.hardware.torchfacts import detected_gpu, load_torch_facts
from roctune.hardware.wheels import ROCM_WHEEL_INDEXES, cuda_wheel_index, rocm_wheel_index, torch_install_line

__all__ = ["ARCHS", "ENV_KEYS", "GPU_MEMORY_GIB", "ROCM_WHEEL_INDEXES", "Arch", "Choice", "Finding", "Gpu",
           "Machine", "Report", "accelerator_name", "bf16_supported", "choose_attention", "choose_device",
           "choose_dtype", "cuda_wheel_index", "detected_gpu", "flash_attn_available", "gather", "gfx_name",
           "gpu_memory_bytes", "gpu_name", "load_torch_facts", "parse_override", "preflight", "rocm_wheel_index",
           "system_memory_bytes", "torch_backend", "torch_dtype", "torch_install_line"]
