"""Vision-language models (issue 48): which of their parts train (the language model by --method; the tower and
projector frozen unless asked), and the pixel bounds images are scaled to."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError, either
from roctune.method_rows import METHODS, able

# roctune.data.images declares the same defaults (LLaMA-Factory's: 768x768 and 32x32 pixels' worth); the data layer
# sits below the settings, so the numbers are written here once more and test_vision checks they agree.
MAX_PIXELS, MIN_PIXELS = 768 * 768, 32 * 32


@dataclass
class VisionSettings:
    # ---- vision-language models: frozen parts and image sizes
    train_vision_tower: bool = setting(False, "train the vision tower's weights too (frozen by default); with "
                                       "--method lora/qlora they train whole beside the adapter, as a freshly built "
                                       "tower needs (see --vision-tower-lora for LoRA on a pretrained one)",
                                       group="vision", resume_fixed=True,
                zh=("训练视觉编码器", "同时训练视觉编码器的权重（默认冻结）；lora/qlora 时它在适配器之外完整训练，新构建的编码器需要这样"
                    "（预训练的编码器可用 --vision-tower-lora 只加 LoRA）"))
    vision_tower_lora: bool = setting(False, "LoRA on the vision tower's linear layers instead of training its "
                                      "weights (--method lora/qlora; a pretrained tower)", group="vision",
                                      resume_fixed=True,
                zh=("视觉编码器 LoRA", "给视觉编码器的线性层加 LoRA，而不是训练它的权重（--method lora/qlora；用于预训练的编码器）"))
    train_projector: bool = setting(False, "train the projector that maps image features into the language model "
                                    "(frozen by default; with LoRA it trains in full and is saved with the adapter)",
                                    group="vision", resume_fixed=True,
                zh=("训练投影层", "训练把图像特征映射进语言模型的投影层（默认冻结；LoRA 时它完整训练并随适配器保存）"))
    image_max_pixels: int = setting(MAX_PIXELS, "scale every image down to at most this many pixels (aspect ratio "
                                    "kept) before the model's processor: bounds each image's token count",
                                    gt=0, metavar="N", group="vision", resume_fixed=True,
                zh=("图像最大像素", "每张图在送入模型处理器之前最多缩放到这么多像素（保持宽高比）：限制每张图的 token 数"))
    image_min_pixels: int = setting(MIN_PIXELS, "scale smaller images up to at least this many pixels",
                                    gt=0, metavar="N", group="vision", resume_fixed=True,
                zh=("图像最小像素", "更小的图放大到至少这么多像素"))

    def check(self) -> None:
        if self.vision_tower_lora and not METHODS[self.method].adapter:
            raise ConfigError(f"--vision-tower-lora puts LoRA on the vision tower, which --method {self.method} does "
                              f"not train with; use --train-vision-tower (its weights) or --method "
                              f"{either(able('adapter'))}")
        if self.image_min_pixels > self.image_max_pixels:
            raise ConfigError(f"--image-min-pixels {self.image_min_pixels} is above --image-max-pixels "
                              f"{self.image_max_pixels}; lower it")
