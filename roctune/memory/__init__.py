"""The memory estimate of a fine-tuning run, from the model's config alone (no weights, no torch), and
what fits a GPU. GPU memory sizes come from `roctune.hardware.gpu_memory`.

    configs       load_config(): a model config from a dir, file, hub cache or the built-in table
    architecture  Architecture: a decoder's sizes and linear layers; which ones LoRA targets
    estimate      estimate(): the peak of one training step, part by part (see its docstring)
    result        MemoryEstimate: the breakdown, as a dict, table or text
    fit           fit_suggestions(), largest_fitting(): what makes a run fit a given memory
"""
from roctune.memory.architecture import Architecture, Linear
from roctune.memory.configs import BUILTIN_CONFIGS, builtin_config, builtin_model_names, load_config
from roctune.memory.estimate import DTYPE_BYTES, QLORA_BYTES_PER_PARAM, estimate
from roctune.memory.fit import Fix, fit_suggestions, largest_fitting
from roctune.memory.result import GiB, MemoryEstimate

__all__ = ["BUILTIN_CONFIGS", "DTYPE_BYTES", "QLORA_BYTES_PER_PARAM", "Architecture", "Fix", "GiB",
           "Linear", "MemoryEstimate", "builtin_config", "builtin_model_names", "estimate", "fit_suggestions",
           "largest_fitting", "load_config"]
