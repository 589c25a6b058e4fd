"""roctune: LoRA fine-tuning of open LLMs that runs first-class on AMD GPUs (ROCm), NVIDIA GPUs (CUDA)
and the CPU, with one code path. `import roctune` is cheap: heavy libraries load when used."""

__version__ = "0.1.0"
