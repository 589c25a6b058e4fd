"""Facts about the Python side of a machine: the installed torch (build, ROCm/CUDA version, the GPUs it
sees, its architecture list, bf16, peer access), transformers/peft/accelerate versions, and whether
flash-attn and bitsandbytes are installed and for which backend.

Facts are a plain dict, so that they can also be given as JSON (`roctune doctor --torch-facts`) to judge
a simulated machine or another one.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import importlib.util
import json
import logging
import os

from roctune.errors import ConfigError
from roctune.hardware.choices import torch_backend

log = logging.getLogger(__name__)

_TORCH_DEFAULTS = {"version": None, "backend": "cpu", "hip": None, "cuda": None, "cuda_available": False,
                   "device_count": 0, "devices": [], "arch_list": [], "bf16": None, "peer": None}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _so_links(path: str, limit: int = 8 << 20) -> str:
    """Which GPU runtime a compiled extension links: 'rocm', 'cuda' or '' (dynamic strings sit near the start)."""
    try:
        with open(path, "rb") as f:
            head = f.read(limit)
    except OSError:
        return ""
    if b"libamdhip64" in head:
        return "rocm"
    if b"libcudart" in head or b"libcuda.so" in head:
        return "cuda"
    return ""


def _flash_attn_facts(try_import: bool) -> dict:
    """flash-attn: installed, version, the backend its extension links, and whether it imports."""
    fa_dir = _package_dir("flash_attn")
    if not fa_dir:
        return {"installed": False}
    fa = {"installed": True, "version": _dist_version("flash_attn") or _dist_version("flash-attn"),
          "build": "", "importable": None, "error": None}
    site = os.path.dirname(fa_dir)
    exts = glob.glob(os.path.join(site, "flash_attn_2_cuda*.so")) + glob.glob(os.path.join(fa_dir, "*.so"))
    for ext in exts:
        fa["build"] = _so_links(ext) or fa["build"]
    if not exts and os.path.isdir(os.path.join(fa_dir, "flash_attn_triton_amd")):
        fa["build"] = "triton-amd"
    if try_import:
        try:
            import flash_attn  # noqa: F401

            fa["importable"] = True
        except Exception as e:  # a build for another backend fails here with an ImportError/OSError
            fa["importable"], fa["error"] = False, f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return fa


def library_facts(try_import: bool = True) -> dict:
    """transformers/peft/accelerate versions; flash-attn and bitsandbytes: installed, built for what."""
    facts: dict = {"packages": {n: _dist_version(n) for n in ("transformers", "peft", "accelerate")}}
    facts["flash_attn"] = _flash_attn_facts(try_import)
    bnb: dict = {"installed": False}
    bnb_dir = _package_dir("bitsandbytes")
    if bnb_dir:
        libs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(bnb_dir, "libbitsandbytes_*")))
        bnb = {"installed": True, "version": _dist_version("bitsandbytes"), "libs": libs}
    facts["bitsandbytes"] = bnb
    return facts


def _device_facts(torch, count: int) -> list[dict]:
    devices = []
    for i in range(count):
        try:
            p = torch.cuda.get_device_properties(i)
            d = {"name": p.name, "total_memory": p.total_memory, "capability": f"{p.major}.{p.minor}",
                 "gcn_arch": (getattr(p, "gcnArchName", "") or "").split(":")[0] or None}
            with contextlib.suppress(Exception):
                d["free_memory"] = torch.cuda.mem_get_info(i)[0]
            devices.append(d)
        except Exception as e:
            devices.append({"name": f"device {i}", "error": str(e)})
    return devices


def live_torch_facts(full: bool = True) -> dict:
    """Facts about the running torch. `full=False` skips everything that initialises the GPU runtime
    or imports optional packages (for preflight, which must stay well under a second on top of torch)."""
    facts = dict(_TORCH_DEFAULTS)
    try:
        import torch
    except ImportError as e:
        facts.update(backend="none", error=str(e))
        return facts
    facts.update(version=torch.__version__, backend=torch_backend(), hip=getattr(torch.version, "hip", None),
                 cuda=getattr(torch.version, "cuda", None))
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
        facts["arch_list"] = list(torch.cuda.get_arch_list()) if facts["backend"] != "cpu" else []
    except Exception as e:  # a broken driver can make these raise instead of returning False
        log.debug("torch.cuda failed: %s", e)
        facts["cuda_available"], facts["error"] = False, f"{type(e).__name__}: {e}"
    if full and facts["cuda_available"]:
        facts["devices"] = _device_facts(torch, facts["device_count"])
        with contextlib.suppress(Exception):
            facts["bf16"] = bool(torch.cuda.is_bf16_supported())
        n = facts["device_count"]
        if n > 1:
            with contextlib.suppress(Exception):
                facts["peer"] = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
                                 for i in range(n)]
    facts.update(library_facts(try_import=full))
    return facts


def complete_torch_facts(given: dict) -> dict:
    """Injected facts (tests, another machine) with the missing keys filled: torch keys from defaults,
    library keys from this machine."""
    facts = dict(_TORCH_DEFAULTS)
    facts.update(given)
    if facts.get("backend") == "rocm" and not facts.get("hip"):
        facts["hip"] = "6.4"
    if facts.get("backend") == "cuda" and not facts.get("cuda"):
        facts["cuda"] = "12.8"
    if facts.get("cuda_available") and not facts.get("device_count"):
        facts["device_count"] = max(1, len(facts.get("devices") or []))
    missing = [k for k in ("packages", "flash_attn", "bitsandbytes") if k not in facts]
    if missing:
        lib = library_facts(try_import=False)
        for k in missing:
            facts[k] = lib[k]
    return facts


def load_torch_facts(spec: str) -> dict:
    """`--torch-facts`: inline JSON, or @FILE / a path to a JSON file."""
    text = spec
    if spec.startswith("@") or (not spec.lstrip().startswith("{") and os.path.isfile(spec)):
        try:
            with open(spec.lstrip("@"), encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"--torch-facts: cannot read {spec.lstrip('@')}: {e.strerror}") from e
        except UnicodeDecodeError:
            raise ConfigError(f"--torch-facts: {spec.lstrip('@')} is not UTF-8 text; give a JSON file") from None
    try:
        facts = json.loads(text)
    except RecursionError:
        raise ConfigError("--torch-facts: JSON nested too deeply; give a flat JSON object") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--torch-facts: not valid JSON ({e.msg} at position {e.pos})") from e
    if not isinstance(facts, dict):
        raise ConfigError("--torch-facts: expected a JSON object")
    return facts


def detected_gpu() -> tuple[str, int] | None:
    """(name, total bytes) of GPU 0 as torch sees it, or None without a usable GPU. Imports torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        return props.name, int(props.total_memory)
    except Exception as e:  # no torch, or a driver that raises: the caller falls back to --gpu/--vram
        log.debug("no GPU detected: %s", e)
        return None
