"""What every method's `build_vision` shares: a vision-language model loaded for training (roctune.vision), every
weight frozen until the method and the vision flags say what trains; and bitsandbytes' exact CPU path, which qlora
keeps for text and vision models alike."""
from __future__ import annotations


def load_vision(cfg, setup, base_model: str, quantization=None):
    """(model, its vision row): the model on setup.device in setup.dtype, nothing trainable yet; `quantization`
    (qlora's config): its language model's linear layers in 4 bits, kept on bitsandbytes' exact CPU path."""
    from roctune import vision

    row = vision.vision_row(base_model)
    model = vision.load_model(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code, quantization)
    if quantization is not None:
        model = exact_4bit(model, setup.device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, row


def exact_4bit(model, device: str):
    """`model` with its 4-bit layers kept on bitsandbytes' exact path on the CPU. bitsandbytes repacks 4-bit weights
    on the first no-grad forward on CPUs with AVX512-BF16, for a kernel that comes from the separate `kernels`
    package; without that package the repacked path gives wrong outputs (measured: logits off by ~40), and the
    repacked weights no longer dequantize. The plain dequantize-then-matmul path is exact."""
    if device == "cpu":
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return model
