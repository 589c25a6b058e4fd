"""Vision-language models (issue 48): which of their parts train, and the pixel bounds images are scaled to."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError

# roctune.data.images declares the same defaults (LLaMA-Factory's: 768x768 and 32x32 pixels' worth); the data layer
# sits below the settings, so the numbers are written here once more and test_vision checks they agree.
MAX_PIXELS, MIN_PIXELS = 768 * 768, 32 * 32


@dataclass
class VisionSettings:
    # ---- vision-language models: frozen parts and image sizes
    train_vision_tower: bool = setting(False, "train the vision tower too (frozen by default): LoRA on its linear "
                                       "layers with --method lora/qlora, its weights with freeze/full",
                                       group="vision", resume_fixed=True,
                zh=("训练视觉编码器", "同时训练视觉编码器（默认冻结）：lora/qlora 时给它的线性层加 LoRA，freeze/full 时训练它的权重"))
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
        if self.image_min_pixels > self.image_max_pixels:
            raise ConfigError(f"--image-min-pixels {self.image_min_pixels} is above --image-max-pixels "
                              f"{self.image_max_pixels}; lower it")
