"""Device, dtype, attention kernel, compiled layers and fused kernels, the self-test."""
from __future__ import annotations

from dataclasses import dataclass
from roctune.hardware.choices import ATTENTION, DEVICES, DTYPES

from roctune.config.schema import setting


@dataclass
class HardwareSettings:
    # ---- hardware
    device: str = setting("auto", "cuda means NVIDIA or AMD ROCm", choices=DEVICES, group="hardware",
                zh=("设备", "cuda 表示 NVIDIA 或 AMD ROCm"))
    dtype: str = setting("auto", "auto: bf16/fp16 on GPU, fp32 on CPU", choices=DTYPES,
                         group="hardware",
                zh=("数据类型", "auto：GPU 上 bf16/fp16，CPU 上 fp32"))
    attn: str = setting("auto", "attention kernel", choices=ATTENTION,
                        group="hardware",
                zh=("注意力实现", "注意力内核"))
    # ---- compiled layers and fused kernels (roctune.training.compiled, issue 38)
    compile: str = setting("auto", "torch.compile the decoder layers (one compile serves every layer); auto: on "
                           "for runs long enough to earn the compile time (CPU: with a C++ compiler)",
                           choices=("auto", "on", "off"),
                           group="hardware",
                zh=("编译", "用 torch.compile 编译解码层（一次编译供所有层使用）；auto：训练足够长时开启（CPU 上需要 C++ 编译器）"))
    fused_kernels: str = setting("auto", "Liger-Kernel's fused RMSNorm/RoPE/SwiGLU where the model's family opts in "
                                 "and Triton runs (a GPU, pip install 'roctune[fused]')", choices=("auto", "off"),
                                 group="hardware",
                zh=("融合内核", "在模型家族支持且 Triton 可运行时（GPU，pip install 'roctune[fused]'）使用 Liger-Kernel 的融合 RMSNorm/RoPE/SwiGLU"))
    selftest: bool = setting(False, "before loading the model, train a tiny model on this path (device, dtype, "
                             "attention, 4-bit) and compare with float64 on the CPU; stop on wrong numbers",
                             group="hardware",
                zh=("自检", "加载模型之前，在这条路径上（设备、数据类型、注意力、4 位）训练一个极小模型并与 CPU 上的 float64 比较；数值不对就停止"))
