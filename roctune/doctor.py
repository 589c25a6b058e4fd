"""`roctune doctor`: what this machine can do for LoRA training, and what to fix when it can't.

Three steps, kept apart so that every judgement can be tested on a simulated machine:

1. `gather(root, user, torch_facts)` reads facts into a `Machine`: GPUs from sysfs and the KFD topology,
   device nodes, group membership, ROCm / NVIDIA driver versions, environment variables, and a dict of
   facts about the Python side (torch build, devices, flash-attn, bitsandbytes). Every file is read
   under `root`, so a mounted system image (or a tree built by the tests) can be diagnosed. Vendor
   tools (rocminfo, nvidia-smi) only add names and memory when present on the live machine.
2. `diagnose(machine)` is a pure function from a `Machine` to a `Report` of findings, each with a
   level (ok / warn / fail), a one-line message, why, and the exact fix.
3. `preflight(device_requested)` is the fast subset that `roctune train` runs first; it raises
   `EnvironmentProblem` when a failing check makes GPU training impossible.

`explain(text)` recognises known failures in a training log and says their cause and fix.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from roctune import env as _env
from roctune.errors import ConfigError, EnvironmentProblem

LEVELS = ("ok", "warn", "fail")
AMD_VENDOR = 0x1002
NVIDIA_VENDOR = 0x10DE
TORCH_FACTS_ENV = "ROCTUNE_DOCTOR_TORCH_FACTS"

# ROCm versions that have a PyTorch wheel index at https://download.pytorch.org/whl/rocmX.Y.
# The one table to update when PyTorch publishes a new ROCm index.
ROCM_WHEEL_INDEXES = ("5.7", "6.0", "6.1", "6.2", "6.2.4", "6.3", "6.4", "7.0", "7.1")
# CUDA wheel indexes with the oldest NVIDIA driver each runs on (Linux, with minor-version compatibility).
CUDA_WHEEL_INDEXES = (("cu130", 580), ("cu128", 570), ("cu126", 525), ("cu118", 450))


@dataclass(frozen=True)
class Arch:
    family: str
    cards: str
    status: str  # "supported" | "override" (runs as another target) | "unsupported"
    override: str = ""  # HSA_OVERRIDE_GFX_VERSION value that makes it run, if any
    bf16: bool = True  # hardware bf16 arithmetic
    sdpa_flash: str = "no"  # PyTorch SDPA flash/efficient kernels (AOTriton): "yes" | "experimental" | "no"
    flash_attn: str = "no"  # flash-attn package: "ck" (ROCm fork, CK backend) | "triton" (Triton AMD backend) | "no"
    note: str = ""


# AMD GPU architectures by gfx target. "status" is for the current official PyTorch ROCm wheels; the
# build's own arch list (torch.cuda.get_arch_list()) refines it on a live ROCm torch.
ARCHS: dict[str, Arch] = {
    "gfx803": Arch("Polaris (GCN 4)", "Radeon RX 470/480/570/580", "unsupported", bf16=False,
                   note="dropped from ROCm years ago; only community builds of old ROCm/PyTorch exist"),
    "gfx900": Arch("Vega 10 (GCN 5)", "Radeon RX Vega 56/64, Instinct MI25", "unsupported", bf16=False,
                   note="no longer in the PyTorch ROCm wheels; the last ones with it are for ROCm 5.x"),
    "gfx902": Arch("Raven Ridge APU (Vega)", "Ryzen 2000/3000 APU graphics", "unsupported", bf16=False),
    "gfx90c": Arch("Renoir/Cezanne APU (Vega)", "Ryzen 4000/5000 APU graphics", "unsupported", bf16=False),
    "gfx906": Arch("Vega 20 (GCN 5)", "Instinct MI50/MI60, Radeon VII, Radeon Pro VII", "unsupported",
                   bf16=False, note="deprecated by AMD and absent from current PyTorch ROCm wheels; "
                   "older wheels (ROCm 5.7 / 6.0 era) still run on it"),
    "gfx908": Arch("CDNA 1", "Instinct MI100", "supported"),
    "gfx90a": Arch("CDNA 2", "Instinct MI210/MI250/MI250X", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx940": Arch("CDNA 3", "Instinct MI300 (early)", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx941": Arch("CDNA 3", "Instinct MI300 (early)", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx942": Arch("CDNA 3", "Instinct MI300X/MI300A/MI325X", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx950": Arch("CDNA 4", "Instinct MI350X/MI355X", "supported", sdpa_flash="yes", flash_attn="ck",
                   note="needs a wheel for ROCm 6.4 or newer"),
    "gfx1010": Arch("RDNA 1 (Navi 10)", "Radeon RX 5700/5700 XT", "unsupported", bf16=False),
    "gfx1011": Arch("RDNA 1 (Navi 12)", "Radeon Pro 5600M/V520", "unsupported", bf16=False),
    "gfx1012": Arch("RDNA 1 (Navi 14)", "Radeon RX 5500/5500 XT", "unsupported", bf16=False),
    "gfx1030": Arch("RDNA 2 (Navi 21)", "Radeon RX 6800/6800 XT/6900 XT/6950 XT, PRO W6800", "supported"),
    "gfx1031": Arch("RDNA 2 (Navi 22)", "Radeon RX 6700/6700 XT/6750 XT", "override", "10.3.0"),
    "gfx1032": Arch("RDNA 2 (Navi 23)", "Radeon RX 6600/6600 XT/6650 XT", "override", "10.3.0"),
    "gfx1033": Arch("RDNA 2 (Van Gogh APU)", "Steam Deck graphics", "override", "10.3.0"),
    "gfx1034": Arch("RDNA 2 (Navi 24)", "Radeon RX 6400/6500 XT", "override", "10.3.0"),
    "gfx1035": Arch("RDNA 2 (Rembrandt APU)", "Radeon 660M/680M", "override", "10.3.0"),
    "gfx1036": Arch("RDNA 2 (Raphael iGPU)", "Ryzen 7000/9000 desktop graphics", "override", "10.3.0"),
    "gfx1100": Arch("RDNA 3 (Navi 31)", "Radeon RX 7900 XTX/XT/GRE, PRO W7900/W7800", "supported",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1101": Arch("RDNA 3 (Navi 32)", "Radeon RX 7800 XT/7700 XT, PRO W7700", "supported", "11.0.0",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1102": Arch("RDNA 3 (Navi 33)", "Radeon RX 7600/7600 XT", "supported", "11.0.0",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1103": Arch("RDNA 3 (Phoenix APU)", "Radeon 740M/760M/780M", "override", "11.0.0"),
    "gfx1150": Arch("RDNA 3.5 (Strix Point APU)", "Radeon 880M/890M", "override", "11.0.0"),
    "gfx1151": Arch("RDNA 3.5 (Strix Halo APU)", "Radeon 8050S/8060S", "supported", "11.0.0",
                    sdpa_flash="experimental", note="needs a recent wheel (ROCm 6.4 or newer)"),
    "gfx1200": Arch("RDNA 4 (Navi 44)", "Radeon RX 9060/9060 XT", "supported", sdpa_flash="experimental",
                    flash_attn="triton", note="needs a wheel for ROCm 6.4 or newer"),
    "gfx1201": Arch("RDNA 4 (Navi 48)", "Radeon RX 9070/9070 XT, AI PRO R9700", "supported",
                    sdpa_flash="experimental", flash_attn="triton", note="needs a wheel for ROCm 6.4 or newer"),
}

# PCI device ids of common AMD cards, for a name when neither torch nor rocminfo gives one.
AMD_DEVICE_NAMES = {
    0x67DF: "Radeon RX 470/480/570/580", 0x687F: "Radeon RX Vega 56/64", 0x66AF: "Radeon VII",
    0x66A1: "Instinct MI50/MI60", 0x738C: "Instinct MI100", 0x740C: "Instinct MI250X/MI250",
    0x740F: "Instinct MI210", 0x74A1: "Instinct MI300X", 0x74A0: "Instinct MI300A", 0x74A5: "Instinct MI325X",
    0x73BF: "Radeon RX 6800/6800 XT/6900 XT", 0x73DF: "Radeon RX 6700 XT/6750 XT",
    0x73FF: "Radeon RX 6600/6600 XT/6650 XT", 0x743F: "Radeon RX 6400/6500 XT",
    0x744C: "Radeon RX 7900 XTX/XT", 0x7448: "Radeon PRO W7900", 0x747E: "Radeon RX 7800 XT/7700 XT",
    0x7480: "Radeon RX 7600/7600 XT", 0x7550: "Radeon RX 9070/9070 XT", 0x7590: "Radeon RX 9060 XT",
}

CONTAINER_FLAGS = "--device /dev/kfd --device /dev/dri --group-add video --group-add render"


# ---------------------------------------------------------------------------------------------- facts


@dataclass
class Gpu:
    vendor: str  # "amd" | "nvidia"
    name: str
    gfx: str | None = None
    vram_bytes: int | None = None
    vram_used_bytes: int | None = None
    device_id: str | None = None  # "0x744c"
    card: str | None = None  # "card1"
    render_minor: int | None = None
    kfd_node: int | None = None
    compute_capability: str | None = None  # NVIDIA "8.6"


@dataclass
class Machine:
    root: str = "/"
    live: bool = True  # root is "/" and the facts describe the running process
    user: str = ""
    user_groups: list[str] = field(default_factory=list)  # from /etc/group and /etc/passwd
    process_groups: list[str] | None = None  # the running process's groups (live, own user only)
    user_known: bool = True
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    kfd_sysfs: bool = False  # /sys/class/kfd exists: amdgpu's compute part is loaded
    dev_kfd: dict | None = None  # {"path", "mode", "group", "accessible"} or None when missing
    render_nodes: list[dict] = field(default_factory=list)
    dev_nvidia: bool = False
    rocm_version: str | None = None
    nvidia_driver: str | None = None
    container: bool = False
    links: dict = field(default_factory=dict)  # "i-j" -> "xgmi" | "pcie" (direct peer links from KFD)
    tools: dict[str, str] = field(default_factory=dict)  # vendor tools found on PATH
    torch: dict = field(default_factory=dict)

    def amd(self) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == "amd"]

    def nvidia(self) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == "nvidia"]


def _path(root: str, rel: str) -> str:
    return os.path.join(root, rel.lstrip("/"))


def _read(root: str, rel: str) -> str | None:
    try:
        with open(_path(root, rel), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _properties(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def gfx_name(target_version: int) -> str | None:
    """KFD `gfx_target_version` (major*10000 + minor*100 + stepping) as a gfx name; 0 (a CPU node) gives None."""
    if not target_version:
        return None
    major, rest = divmod(target_version, 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor:x}{step:x}"


def parse_override(value: str | None) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION "10.3.0" as "gfx1030"; None when unset or malformed."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not m:
        return None
    major, minor, step = (int(x) for x in m.groups())
    return gfx_name(major * 10000 + minor * 100 + step)


def _gfx_major(gfx: str) -> str:
    digits = gfx[3:]
    return digits[:-2] if len(digits) >= 3 else digits


def _groups_db(root: str) -> tuple[dict[str, tuple[int, list[str]]], dict[str, tuple[int, int]]]:
    groups: dict[str, tuple[int, list[str]]] = {}
    for line in (_read(root, "/etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit():
            groups[parts[0]] = (int(parts[2]), [m for m in parts[3].split(",") if m])
    users: dict[str, tuple[int, int]] = {}
    for line in (_read(root, "/etc/passwd") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            users[parts[0]] = (int(parts[2]), int(parts[3]))
    return groups, users


def _current_user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return ""


def _device_node(root: str, rel: str, live_access: bool, user: str, user_groups: list[str],
                 groups: dict, users: dict) -> dict | None:
    path = _path(root, rel)
    try:
        st = os.stat(path)
    except OSError:
        return None
    gid_names = {gid: name for name, (gid, _) in groups.items()}
    group = gid_names.get(st.st_gid)
    mode = stat.S_IMODE(st.st_mode)
    if live_access:
        accessible = os.access(path, os.R_OK | os.W_OK)
    elif user == "root":
        accessible = True
    else:
        uid = users.get(user, (None, None))[0]
        accessible = ((mode & 0o006) == 0o006
                      or (uid is not None and uid == st.st_uid and (mode & 0o600) == 0o600)
                      or (group is not None and group in user_groups and (mode & 0o060) == 0o060))
    return {"path": rel, "mode": f"{mode:04o}", "group": group, "accessible": accessible,
            "world": (mode & 0o006) == 0o006}


def _in_container(root: str) -> bool:
    if os.path.exists(_path(root, "/.dockerenv")) or os.path.exists(_path(root, "/run/.containerenv")):
        return True
    cgroup = _read(root, "/proc/1/cgroup") or ""
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))


def _read_env(root: str, live: bool, env: dict | None) -> dict[str, str]:
    if env is not None:
        return dict(env)
    out: dict[str, str] = {}
    if not live:  # a mounted image: its /etc/environment, then what this shell sets on top
        for line in (_read(root, "/etc/environment") or "").splitlines():
            m = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
            if m:
                out[m.group(1)] = m.group(2).strip().strip("\"'")
    out.update(os.environ)
    return out


def _sysfs_gpus(root: str) -> tuple[list[Gpu], bool, dict]:
    gpus: list[Gpu] = []
    kfd_dir = _path(root, "/sys/class/kfd/kfd/topology/nodes")
    kfd_sysfs = os.path.isdir(_path(root, "/sys/class/kfd"))
    cards = {}
    for vendor_file in sorted(glob.glob(_path(root, "/sys/class/drm/card*/device/vendor"))):
        card = vendor_file.split(os.sep)[-3]
        if not re.fullmatch(r"card\d+", card):
            continue
        dev = os.path.dirname(vendor_file)
        renders = glob.glob(os.path.join(dev, "drm", "renderD*"))
        cards[card] = {
            "vendor": _int(_read("/", vendor_file), 16),
            "device": _read("/", os.path.join(dev, "device")),
            "vram": _int(_read("/", os.path.join(dev, "mem_info_vram_total"))),
            "vram_used": _int(_read("/", os.path.join(dev, "mem_info_vram_used"))),
            "render_minor": _int(os.path.basename(renders[0])[len("renderD"):]) if renders else None,
        }
    nodes = sorted((int(n) for n in os.listdir(kfd_dir) if n.isdigit()), key=int) if os.path.isdir(kfd_dir) else []
    node_to_gpu: dict[int, int] = {}
    used_cards: set[str] = set()
    for n in nodes:
        props = _properties(_read(root, f"/sys/class/kfd/kfd/topology/nodes/{n}/properties"))
        gfx = gfx_name(props.get("gfx_target_version", 0))
        if not gfx:
            continue  # a CPU node
        if props.get("vendor_id", AMD_VENDOR) != AMD_VENDOR:
            continue
        minor = props.get("drm_render_minor")
        card = next((c for c, info in cards.items() if info["render_minor"] == minor and minor is not None), None)
        if card is None:  # no render node link in sysfs: take the next AMD card in order
            card = next((c for c, info in cards.items() if info["vendor"] == AMD_VENDOR and c not in used_cards), None)
        info = cards.get(card, {}) if card else {}
        if card:
            used_cards.add(card)
        device_id = props.get("device_id") or _int(info.get("device"), 16)
        node_to_gpu[n] = len(gpus)
        gpus.append(Gpu("amd", "", gfx=gfx, vram_bytes=info.get("vram"), vram_used_bytes=info.get("vram_used"),
                        device_id=f"0x{device_id:04x}" if device_id else None, card=card,
                        render_minor=minor, kfd_node=n))
    for card, info in cards.items():
        if card in used_cards or info["vendor"] not in (AMD_VENDOR, NVIDIA_VENDOR):
            continue
        device_id = _int(info.get("device"), 16)
        gpus.append(Gpu("amd" if info["vendor"] == AMD_VENDOR else "nvidia", "", vram_bytes=info.get("vram"),
                        vram_used_bytes=info.get("vram_used"), device_id=f"0x{device_id:04x}" if device_id else None,
                        card=card, render_minor=info.get("render_minor")))
    # direct GPU-to-GPU links (XGMI, or PCIe peer-to-peer) from the KFD topology
    links: dict[str, str] = {}
    for n, gi in node_to_gpu.items():
        for kind in ("io_links", "p2p_links"):
            for prop_file in glob.glob(os.path.join(kfd_dir, str(n), kind, "*", "properties")):
                props = _properties(_read("/", prop_file))
                to = props.get("node_to")
                if to in node_to_gpu and to != n:
                    a, b = sorted((gi, node_to_gpu[to]))
                    kind_name = "xgmi" if props.get("type") == 11 else "pcie"
                    if links.get(f"{a}-{b}") != "xgmi":
                        links[f"{a}-{b}"] = kind_name
    return gpus, kfd_sysfs, links


def _run_tool(args: list[str], timeout: float = 8.0) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _tools_facts(machine: Machine) -> None:
    """Names and memory from vendor tools when installed (live machine only; never required)."""
    for tool in ("rocminfo", "amd-smi", "rocm-smi", "nvidia-smi"):
        path = shutil.which(tool)
        if path:
            machine.tools[tool] = path
    if "rocminfo" in machine.tools and machine.amd():
        text = _run_tool(["rocminfo"]) or ""
        names = []
        for block in text.split("Agent ")[1:]:
            gfx = re.search(r"^\s*Name:\s*(gfx\w+)", block, re.M)
            market = re.search(r"^\s*Marketing Name:\s*(.+)$", block, re.M)
            if gfx and market:
                names.append((gfx.group(1), market.group(1).strip()))
        for gpu, (gfx, name) in zip(machine.amd(), names):
            if gpu.gfx == gfx and not gpu.name:
                gpu.name = name
    if "nvidia-smi" in machine.tools and machine.nvidia():
        text = _run_tool(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,compute_cap",
                          "--format=csv,noheader,nounits"]) or ""
        for gpu, line in zip(machine.nvidia(), [ln for ln in text.splitlines() if ln.strip()]):
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3:
                gpu.name = gpu.name or parts[0]
                gpu.vram_bytes = gpu.vram_bytes or (_int(parts[1]) or 0) * 2**20 or None
                gpu.vram_used_bytes = gpu.vram_used_bytes or (_int(parts[2]) or 0) * 2**20 or None
                if len(parts) >= 4 and not gpu.compute_capability:
                    gpu.compute_capability = parts[3]


# ----------------------------------------------------------------------------------------- torch facts

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


def library_facts(try_import: bool = True) -> dict:
    """transformers/peft/accelerate versions; flash-attn and bitsandbytes: installed, built for what."""
    facts: dict = {"packages": {n: _dist_version(n) for n in ("transformers", "peft", "accelerate")}}
    fa: dict = {"installed": False}
    fa_dir = _package_dir("flash_attn")
    if fa_dir:
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
    facts["flash_attn"] = fa
    bnb: dict = {"installed": False}
    bnb_dir = _package_dir("bitsandbytes")
    if bnb_dir:
        libs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(bnb_dir, "libbitsandbytes_*")))
        bnb = {"installed": True, "version": _dist_version("bitsandbytes"), "libs": libs}
    facts["bitsandbytes"] = bnb
    return facts


def live_torch_facts(full: bool = True) -> dict:
    """Facts about the running torch. `full=False` skips everything that initialises the GPU runtime
    or imports optional packages (for preflight, which must stay well under a second on top of torch)."""
    facts = dict(_TORCH_DEFAULTS)
    try:
        import torch
    except ImportError as e:
        facts.update(backend="none", error=str(e))
        return facts
    facts.update(version=torch.__version__, backend=_env.torch_backend(), hip=getattr(torch.version, "hip", None),
                 cuda=getattr(torch.version, "cuda", None))
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
        facts["arch_list"] = list(torch.cuda.get_arch_list()) if facts["backend"] != "cpu" else []
    except Exception as e:  # a broken driver can make these raise instead of returning False
        facts["cuda_available"], facts["error"] = False, f"{type(e).__name__}: {e}"
    if full and facts["cuda_available"]:
        devices = []
        for i in range(facts["device_count"]):
            try:
                p = torch.cuda.get_device_properties(i)
                d = {"name": p.name, "total_memory": p.total_memory, "capability": f"{p.major}.{p.minor}",
                     "gcn_arch": (getattr(p, "gcnArchName", "") or "").split(":")[0] or None}
                with contextlib.suppress(Exception):
                    d["free_memory"] = torch.cuda.mem_get_info(i)[0]
                devices.append(d)
            except Exception as e:
                devices.append({"name": f"device {i}", "error": str(e)})
        facts["devices"] = devices
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
    try:
        facts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--torch-facts: not valid JSON ({e.msg} at position {e.pos})") from e
    if not isinstance(facts, dict):
        raise ConfigError("--torch-facts: expected a JSON object")
    return facts


# -------------------------------------------------------------------------------------------- gather


def gather(root: str = "/", user: str | None = None, torch_facts: dict | None = None, *,
           env: dict | None = None, use_tools: bool = True, full: bool = True) -> Machine:
    """Read the facts of the machine under `root`. `torch_facts` replaces the running torch (simulation)."""
    root = os.path.abspath(root or "/")
    live = root == "/"
    m = Machine(root=root, live=live)
    m.env = _read_env(root, live, env)
    groups, users = _groups_db(root)
    own_user = user is None
    m.user = user or _current_user()
    m.user_groups = sorted(name for name, (_, members) in groups.items() if m.user in members)
    if m.user in users:
        primary = users[m.user][1]
        m.user_groups = sorted(set(m.user_groups) | {n for n, (gid, _) in groups.items() if gid == primary})
    m.user_known = m.user in users or bool(m.user_groups) or m.user == "root"
    if live and own_user and hasattr(os, "getgroups"):
        gid_names = {gid: name for name, (gid, _) in groups.items()}
        m.process_groups = sorted({gid_names.get(g, str(g)) for g in os.getgroups()})
    live_access = live and own_user
    m.gpus, m.kfd_sysfs, m.links = _sysfs_gpus(root)
    m.dev_kfd = _device_node(root, "/dev/kfd", live_access, m.user, m.user_groups, groups, users)
    for p in sorted(glob.glob(_path(root, "/dev/dri/renderD*"))):
        node = _device_node(root, "/dev/dri/" + os.path.basename(p), live_access, m.user, m.user_groups,
                            groups, users)
        if node:
            m.render_nodes.append(node)
    m.dev_nvidia = os.path.exists(_path(root, "/dev/nvidiactl")) or bool(glob.glob(_path(root, "/dev/nvidia[0-9]*")))
    version = _read(root, "/opt/rocm/.info/version")
    if version is None:
        for f in sorted(glob.glob(_path(root, "/opt/rocm-*/.info/version")), reverse=True):
            version = _read("/", f)
            break
    m.rocm_version = re.match(r"[\d.]+", version).group(0).rstrip(".") if version and re.match(r"\d", version) else None
    nv = _read(root, "/proc/driver/nvidia/version")
    if nv is not None:
        found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", nv)
        m.nvidia_driver = found.group(1) if found else "unknown"
    m.container = _in_container(root)
    m.torch = complete_torch_facts(torch_facts) if torch_facts is not None else live_torch_facts(full=full)
    # names and memory: torch first (when it describes these GPUs), then vendor tools, then tables
    devices = m.torch.get("devices") or []
    backend_vendor = {"rocm": "amd", "cuda": "nvidia"}.get(m.torch.get("backend"))
    visible = [g for g in m.gpus if g.vendor == backend_vendor]
    if devices and len(devices) == len(visible):
        for g, d in zip(visible, devices):
            g.name = g.name or d.get("name") or ""
            g.vram_bytes = g.vram_bytes or d.get("total_memory")
            if d.get("free_memory") is not None and g.vram_bytes and g.vram_used_bytes is None:
                g.vram_used_bytes = g.vram_bytes - d["free_memory"]
            if g.vendor == "nvidia" and d.get("capability"):
                g.compute_capability = str(d["capability"])
    if live and use_tools:
        _tools_facts(m)
    for g in m.gpus:
        if g.name:
            continue
        did = _int(g.device_id, 16) if g.device_id else None
        if g.vendor == "amd":
            arch = ARCHS.get(g.gfx or "")
            g.name = AMD_DEVICE_NAMES.get(did or -1) or (f"AMD {arch.family} GPU" if arch else "AMD GPU")
        else:
            g.name = f"NVIDIA GPU [10de:{did:04x}]" if did else "NVIDIA GPU"
    return m


# ------------------------------------------------------------------------------------------ diagnose


@dataclass
class Finding:
    id: str
    level: str
    message: str
    why: str = ""
    fix: str = ""


@dataclass
class Report:
    findings: list[Finding]
    machine: Machine

    @property
    def verdict(self) -> str:
        worst = max((LEVELS.index(f.level) for f in self.findings), default=0)
        return LEVELS[worst]

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0

    def get(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)

    def blocking(self) -> list[Finding]:
        """Failing findings that make GPU training impossible (what preflight stops on)."""
        return [f for f in self.findings if f.level == "fail" and f.id in BLOCKING]

    def to_dict(self) -> dict:
        m = self.machine
        torch = {k: v for k, v in m.torch.items() if k not in ("packages", "flash_attn", "bitsandbytes")}
        return {
            "verdict": self.verdict,
            "torch": torch,
            "gpus": [{k: v for k, v in asdict(g).items()} for g in m.gpus],
            "findings": [asdict(f) for f in self.findings],
            "libraries": {k: m.torch.get(k) for k in ("packages", "flash_attn", "bitsandbytes")},
            "machine": {"root": m.root, "live": m.live, "user": m.user, "groups": m.user_groups,
                        "rocm_version": m.rocm_version, "nvidia_driver": m.nvidia_driver,
                        "container": m.container, "tools": sorted(m.tools),
                        "env": {k: m.env[k] for k in ENV_KEYS if k in m.env}},
        }


# Failing findings after which GPU training cannot work (preflight raises on these unless --device cpu).
BLOCKING = {"torch.build", "torch.gpu", "amd.kfd", "amd.render", "amd.access", "nvidia.driver", "visible"}
ENV_KEYS = ("HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
            "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "FLASH_ATTENTION_TRITON_AMD_ENABLE")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def rocm_wheel_index(installed: str | None) -> str:
    """The PyTorch ROCm wheel index for an installed ROCm version: the newest published one not newer
    than it (the newest of all when ROCm is absent or newer than every index; the oldest when older)."""
    published = sorted(ROCM_WHEEL_INDEXES, key=_version_tuple)
    best = published[-1]
    if installed:
        have = _version_tuple(installed)
        older = [p for p in published if _version_tuple(p) <= have]
        best = older[-1] if older else published[0]
    return f"https://download.pytorch.org/whl/rocm{best}"


def cuda_wheel_index(driver: str | None) -> str:
    major = _version_tuple(driver)[0] if driver and _version_tuple(driver) else None
    for name, min_driver in CUDA_WHEEL_INDEXES:
        if major is None or major >= min_driver:
            return f"https://download.pytorch.org/whl/{name}"
    return f"https://download.pytorch.org/whl/{CUDA_WHEEL_INDEXES[-1][0]}"


def torch_install_line(index_url: str) -> str:
    return f"pip uninstall -y torch && pip install torch --index-url {index_url}"


def _gb(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def _size_b(x: float) -> str:
    return f"~{x:.0f}B" if x >= 10 else f"~{x:.1f}B"


def lora_fit(vram_bytes: int) -> tuple[float, float]:
    """Rough largest model (billions of parameters) for LoRA in bf16 and for QLoRA (4-bit) at short
    sequence lengths and small batches: about 2.4 and 0.75 bytes per parameter after ~1.5 GiB overhead."""
    usable = max(0.0, vram_bytes / 2**30 * 0.92 - 1.5)
    return usable / 2.4, usable / 0.75


def _visible_env(m: Machine, vendor: str) -> tuple[str, str] | None:
    keys = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if vendor == "amd" \
        else ("CUDA_VISIBLE_DEVICES",)
    for k in keys:
        if k in m.env:
            return k, m.env[k]
    return None


def _visible_indices(m: Machine, vendor: str, count: int) -> list[int]:
    """Indices (among this vendor's GPUs) left visible by *_VISIBLE_DEVICES; all when unset or not numeric."""
    visible = list(range(count))
    keys = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if vendor == "amd" \
        else ("CUDA_VISIBLE_DEVICES",)
    for k in keys:  # ROCR filters first, HIP/CUDA then index into what is left
        if k not in m.env:
            continue
        value = m.env[k].strip()
        if value in ("", "-1"):
            return []
        items = [x.strip() for x in value.split(",")]
        if not all(x.isdigit() for x in items):
            continue  # UUIDs: cannot resolve here, assume all
        picked = []
        for x in items:
            if int(x) >= len(visible):
                break  # the runtimes stop at the first invalid index
            picked.append(visible[int(x)])
        visible = picked
    return visible


@contextlib.contextmanager
def _as_if(facts: dict):
    """Run roctune.env's dtype/attention choice against `facts` instead of the live torch, so that doctor
    and `roctune train` share one decision. (Swaps two module attributes for the duration; not thread-safe.)"""
    saved = _env.bf16_supported, _env.flash_attn_available
    fa = facts.get("flash_attn") or {}
    _env.bf16_supported = lambda device: device != "cpu" and bool(facts.get("bf16"))
    _env.flash_attn_available = lambda: bool(fa.get("installed"))
    try:
        yield
    finally:
        _env.bf16_supported, _env.flash_attn_available = saved


def _arch_state(gfx: str, m: Machine) -> tuple[str, str]:
    """How torch runs on `gfx`: ('native'|'override'|'missing'|'unsupported'|'unknown', override value)."""
    arch = ARCHS.get(gfx)
    arch_list = {a.split(":")[0] for a in (m.torch.get("arch_list") or [])}
    if m.torch.get("backend") == "rocm" and arch_list:
        if gfx in arch_list:
            return "native", ""
        if arch and arch.override and parse_override(arch.override) in arch_list:
            return "override", arch.override
        if arch and arch.status == "unsupported":
            return "unsupported", ""
        return ("missing" if arch else "unknown"), ""
    if arch is None:
        return "unknown", ""
    if arch.status == "supported":
        return "native", ""
    return arch.status, arch.override


def diagnose(m: Machine) -> Report:
    """Judge a Machine: a pure function of the facts (see `_as_if` for the dtype/attention choice)."""
    t = m.torch
    out: list[Finding] = []
    add = lambda *a, **k: out.append(Finding(*a, **k))  # noqa: E731
    backend = t.get("backend", "cpu")
    amd, nv = m.amd(), m.nvidia()
    label = {"rocm": f"ROCm {t.get('hip') or ''}".strip(), "cuda": f"CUDA {t.get('cuda') or ''}".strip(),
             "cpu": "CPU-only"}.get(backend, backend)
    torch_desc = f"torch {t.get('version') or '?'} ({label} build)"
    states = {i: _arch_state(g.gfx, m) for i, g in enumerate(m.gpus) if g.vendor == "amd" and g.gfx}
    amd_usable = [g for i, g in enumerate(m.gpus) if g.vendor == "amd" and
                  (not g.gfx or states[i][0] not in ("unsupported",))]

    # --- the torch build against the hardware
    if backend == "none":
        add("torch.build", "fail", "torch is not installed", t.get("error", ""),
            "make setup  (or: pip install torch --index-url " + (rocm_wheel_index(m.rocm_version) if amd
                                                                  else "https://download.pytorch.org/whl/cpu") + ")")
    elif amd and backend != "rocm":
        index = rocm_wheel_index(m.rocm_version)
        why = (f"PyTorch reaches AMD GPUs only through its ROCm build; the wheel index is matched to the installed "
               f"ROCm {m.rocm_version}" if m.rocm_version else
               "PyTorch reaches AMD GPUs only through its ROCm build (the wheels bundle the ROCm runtime, so "
               "a system ROCm install is optional)")
        if amd_usable:
            add("torch.build", "fail", f"AMD GPU present but {torch_desc} cannot use it", why,
                torch_install_line(index))
        else:
            add("torch.build", "warn", f"{torch_desc}; the AMD GPU here is not supported by PyTorch ROCm, so "
                "training runs on the CPU", why, "nothing to install: use --device cpu (see the architecture line)")
    elif nv and not amd and backend != "cuda":
        add("torch.build", "fail", f"NVIDIA GPU present but {torch_desc} cannot use it",
            "PyTorch reaches NVIDIA GPUs only through its CUDA build"
            + (f"; index chosen for driver {m.nvidia_driver}" if m.nvidia_driver else ""),
            torch_install_line(cuda_wheel_index(m.nvidia_driver)))
    elif not m.gpus and backend != "cpu":
        add("torch.build", "ok", f"{torch_desc}", "no GPU found on this machine; it will run on the CPU")
    else:
        add("torch.build", "ok", torch_desc, "matches the hardware" if m.gpus else "no GPU on this machine")

    # --- AMD: driver, device nodes, permissions
    if amd:
        if m.dev_kfd is None:
            if m.container:
                add("amd.kfd", "fail", "/dev/kfd is missing in this container",
                    "the container was started without the GPU device nodes",
                    f"restart the container with: docker run {CONTAINER_FLAGS} ... "
                    "(podman: the same --device flags)")
            elif not m.kfd_sysfs:
                add("amd.kfd", "fail", "/dev/kfd is missing: the amdgpu compute driver (KFD) is not loaded",
                    "an AMD GPU is on the PCI bus but /sys/class/kfd does not exist",
                    "sudo modprobe amdgpu; if that fails install the driver (`sudo amdgpu-install --usecase=dkms`) "
                    "and reboot; `sudo dmesg | grep -i amdgpu` shows why it did not load")
            else:
                add("amd.kfd", "fail", "/dev/kfd is missing although the amdgpu driver is loaded",
                    "udev did not create the device node",
                    "sudo udevadm trigger (or reboot); in a container: docker run " + CONTAINER_FLAGS)
        if not m.render_nodes and m.dev_kfd is not None:
            add("amd.render", "fail", "no /dev/dri/renderD* node", "HIP opens the GPU's render node as well as /dev/kfd",
                f"in a container: docker run {CONTAINER_FLAGS}; on the host: sudo udevadm trigger or reboot")
        nodes = ([m.dev_kfd] if m.dev_kfd else []) + m.render_nodes[:1]
        blocked = [n for n in nodes if not n["accessible"]]
        if nodes and not m.user_known:
            add("amd.access", "warn", f"user {m.user!r} is not in {m.root.rstrip('/')}/etc/passwd or /etc/group",
                "group membership cannot be judged", "check the name given with --user")
        elif blocked:
            need = sorted({n["group"] for n in blocked if n["group"]} or {"render"})
            in_db = [g for g in need if g in m.user_groups]
            names = ", ".join(f"{n['path']} (group {n['group'] or '?'}, mode {n['mode']})" for n in blocked)
            if in_db and m.process_groups is not None and not set(need) & set(m.process_groups):
                add("amd.access", "fail", f"{m.user} was added to {'/'.join(need)} but this session predates it",
                    f"cannot open {names}; group changes apply to new logins only",
                    "log out and in (or reboot); for this shell only: newgrp render")
            else:
                add("amd.access", "fail", f"user {m.user} cannot open {names}",
                    f"{m.user} is in groups [{', '.join(m.user_groups) or 'none'}], not in {' or '.join(need)}",
                    f"sudo usermod -aG render,video {m.user}, then log out and in"
                    + (f" (in a container: docker run ... --group-add render --group-add video)" if m.container else ""))
        elif nodes:
            add("amd.access", "ok", f"{m.user} can open " + " and ".join(n["path"] for n in nodes),
                "world-accessible" if all(n["world"] for n in nodes) else
                f"member of {', '.join(g for g in m.user_groups if g in ('render', 'video')) or 'the owning group'}")
        if m.rocm_version:
            add("amd.rocm", "ok", f"ROCm {m.rocm_version} installed", "PyTorch wheels bundle their own ROCm "
                "runtime; the system one matters for tools and for building extensions")

    # --- NVIDIA driver
    if nv and not amd:
        if m.nvidia_driver is None:
            fix = ("restart the container with --gpus all (NVIDIA Container Toolkit)" if m.container else
                   "install the NVIDIA driver (e.g. `sudo ubuntu-drivers install`), reboot, then check `nvidia-smi`")
            add("nvidia.driver", "fail", "NVIDIA GPU present but the NVIDIA driver is not loaded",
                "/proc/driver/nvidia/version does not exist", fix)
        else:
            add("nvidia.driver", "ok", f"NVIDIA driver {m.nvidia_driver}", "")

    # --- visibility through *_VISIBLE_DEVICES
    for vendor, gpus in (("amd", amd), ("nvidia", nv)):
        hidden = _visible_env(m, vendor)
        if gpus and hidden and not _visible_indices(m, vendor, len(gpus)):
            add("visible", "fail", f"{hidden[0]}={hidden[1]!r} hides every GPU",
                "the runtime only shows the GPUs listed there", f"unset {hidden[0]}  (or list GPUs: {hidden[0]}=0)")

    # --- torch sees the GPU?
    if backend in ("rocm", "cuda") and m.gpus and not t.get("cuda_available"):
        if not any(f.level == "fail" for f in out):
            add("torch.gpu", "fail", f"{torch_desc} sees no GPU (torch.cuda.is_available() is False)",
                t.get("error") or "driver, device permissions or visibility env vars",
                "run `roctune doctor --json` on the host and compare; check `rocminfo`/`nvidia-smi` works for this user")
    elif backend in ("rocm", "cuda") and t.get("cuda_available"):
        n = t.get("device_count") or 0
        add("torch.gpu", "ok", f"torch sees {n} GPU{'s' if n != 1 else ''}",
            ", ".join(d.get("name", "?") for d in t.get("devices") or []))

    # --- architecture of each AMD GPU
    override = m.env.get("HSA_OVERRIDE_GFX_VERSION")
    override_gfx = parse_override(override)
    for i, g in enumerate(m.gpus):
        if g.vendor != "amd" or not g.gfx:
            continue
        arch = ARCHS.get(g.gfx)
        fid = f"gpu{i}.arch"
        desc = f"GPU {i}: {g.name} ({g.gfx}{', ' + arch.family if arch else ''})"
        state, value = states[i]
        rocm_torch = backend == "rocm"
        if override is not None and override_gfx is None:
            add(fid + ".override", "warn", f"HSA_OVERRIDE_GFX_VERSION={override!r} is not a version like 10.3.0",
                "the ROCm runtime ignores or misreads it", "unset HSA_OVERRIDE_GFX_VERSION")
        elif override_gfx and override_gfx != g.gfx:
            if _gfx_major(override_gfx) != _gfx_major(g.gfx):
                good = f"export HSA_OVERRIDE_GFX_VERSION={arch.override}" if arch and arch.override and \
                    state == "override" else "unset HSA_OVERRIDE_GFX_VERSION"
                add(fid + ".override", "warn", f"HSA_OVERRIDE_GFX_VERSION={override} makes the {g.gfx} pose as "
                    f"{override_gfx}, a different generation", "kernels built for another generation crash or "
                    "compute garbage", good)
            elif state == "native":
                add(fid + ".override", "warn", f"HSA_OVERRIDE_GFX_VERSION={override} is set but {g.gfx} is "
                    "supported natively", "the override makes ROCm load kernels for another chip",
                    "unset HSA_OVERRIDE_GFX_VERSION")
            elif state == "override" and value and parse_override(value) != override_gfx:
                add(fid + ".override", "warn", f"HSA_OVERRIDE_GFX_VERSION={override} is not the value for {g.gfx}",
                    f"{g.gfx} runs with the {parse_override(value)} kernels",
                    f"export HSA_OVERRIDE_GFX_VERSION={value}")
        if state == "native":
            where = "this torch build has kernels for it" if rocm_torch and t.get("arch_list") else \
                "supported by the official PyTorch ROCm wheels"
            add(fid, "ok", f"{desc}: {where}", (arch.note if arch else ""))
        elif state == "override":
            if override_gfx == parse_override(value):
                add(fid, "ok", f"{desc}: runs through HSA_OVERRIDE_GFX_VERSION={value}",
                    f"not in the official wheels; the {parse_override(value)} kernels work on it")
            else:
                add(fid, "fail" if rocm_torch else "warn",
                    f"{desc}: needs HSA_OVERRIDE_GFX_VERSION={value}",
                    f"the official PyTorch ROCm wheels have no {g.gfx} kernels; it runs the "
                    f"{parse_override(value)} ones (without the override: hipErrorNoBinaryForGpu)",
                    f"export HSA_OVERRIDE_GFX_VERSION={value}  (add it to ~/.bashrc)")
        elif state == "unsupported":
            add(fid, "fail" if rocm_torch else "warn",
                f"{desc}: not supported by the official PyTorch ROCm wheels",
                (arch.note if arch else "") + "; no override makes current wheels run on it. What remains: "
                "training on the CPU, or an old ROCm/PyTorch combination built for it (unsupported)",
                "roctune train --device cpu ...")
        elif state == "missing":
            add(fid, "fail" if rocm_torch else "warn", f"{desc}: this torch build has no kernels for {g.gfx}",
                f"its arch list is {', '.join(t.get('arch_list') or [])}" + (f"; {arch.note}" if arch and arch.note else ""),
                torch_install_line(rocm_wheel_index(None)))
        else:
            add(fid, "warn", f"{desc}: an architecture roctune does not know",
                "whether PyTorch ROCm supports it is not known here", "check `rocminfo` and the ROCm support matrix")

    # --- NVIDIA compute capability
    for i, g in enumerate(m.gpus):
        if g.vendor == "nvidia" and g.compute_capability:
            cc = _version_tuple(g.compute_capability)
            add(f"gpu{i}.arch", "ok" if cc >= (7, 0) else "warn", f"GPU {i}: {g.name} (compute capability "
                f"{g.compute_capability})", "" if cc >= (7, 0) else "current CUDA wheels need 7.0 or newer",
                "" if cc >= (7, 0) else "roctune train --device cpu ...")

    # --- dtype and attention, from roctune.env so that train decides the same
    train_gpu = backend in ("rocm", "cuda") and bool(t.get("cuda_available"))
    device = "cuda" if train_gpu else "cpu"
    gpu0 = next((g for g in m.gpus if g.vendor == {"rocm": "amd", "cuda": "nvidia"}.get(backend)), None) \
        if train_gpu else None
    arch0 = ARCHS.get(gpu0.gfx or "") if gpu0 and gpu0.vendor == "amd" else None
    facts = dict(t)
    if train_gpu and facts.get("bf16") is None:  # not measured (preflight, or injected): from the hardware
        cc = _version_tuple(gpu0.compute_capability) if gpu0 and gpu0.compute_capability else ()
        facts["bf16"] = arch0.bf16 if arch0 else (cc >= (8, 0) if cc else True)
    with _as_if(facts):
        dtype = _env.choose_dtype("auto", device)
        attn = _env.choose_attention("auto", device, dtype.value)
    if train_gpu:
        why = dtype.reason
        if arch0 and not arch0.bf16 and dtype.value == "bf16":
            why += f"; but {gpu0.gfx} has no bf16 hardware, so it is emulated and slow: --dtype fp16 is faster"
        add("bf16", "ok", f"bf16 {'supported' if facts['bf16'] else 'not supported'}: training uses {dtype.value}",
            why)
    elif amd_usable and backend != "rocm":
        future = ARCHS.get(amd_usable[0].gfx or "")
        add("bf16", "ok", f"training uses {dtype.value} on the CPU for now",
            f"{dtype.reason}; with ROCm torch this GPU would train in "
            f"{'bf16' if (future.bf16 if future else True) else 'fp16'}")
    else:
        add("bf16", "ok", f"training uses {dtype.value}", dtype.reason)
    attn_fix, attn_why = "", attn.reason
    if train_gpu and backend == "rocm" and attn.value == "sdpa" and arch0:
        if arch0.sdpa_flash == "yes":
            attn_why += f"; its flash and memory-efficient kernels (AOTriton) support {gpu0.gfx}"
        elif arch0.sdpa_flash == "experimental":
            if m.env.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") == "1":
                attn_why += f"; experimental flash kernels for {gpu0.gfx} enabled"
            else:
                attn_why += f"; its flash path for {gpu0.gfx} is experimental and off, so it falls back to slower kernels"
                attn_fix = "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1"
        else:
            attn_why += f"; no flash kernels for {gpu0.gfx}: it uses the math kernel (more memory at long lengths)"
    add("attention", "ok", f"attention: {attn.value}", attn_why, attn_fix)

    fa = t.get("flash_attn") or {}
    if fa.get("installed"):
        problems = []
        if fa.get("importable") is False:
            problems.append(f"it fails to import ({fa.get('error')})")
        if fa.get("build") in ("rocm", "cuda") and backend in ("rocm", "cuda") and \
                fa["build"] != backend:
            problems.append(f"it is built for {fa['build'].upper()} but torch is {backend.upper()}")
        if backend == "cpu" or not train_gpu:
            pass  # unused on the CPU; say so below
        elif gpu0 and gpu0.vendor == "amd" and arch0 and arch0.flash_attn == "no":
            problems.append(f"flash-attn has no kernels for {gpu0.gfx}")
        elif gpu0 and gpu0.vendor == "nvidia" and gpu0.compute_capability and \
                _version_tuple(gpu0.compute_capability) < (8, 0):
            problems.append("flash-attn 2 needs compute capability 8.0 (Ampere) or newer")
        ver = f"flash-attn {fa.get('version') or ''}".strip()
        if problems:
            add("flash_attn", "warn", f"{ver} installed but unusable: " + "; ".join(problems),
                "auto attention picks flash_attention_2 whenever flash-attn is installed",
                "pass --attn sdpa, or pip uninstall -y flash-attn")
        elif not train_gpu:
            add("flash_attn", "ok", f"{ver} installed (not used on the CPU)", "")
        else:
            hint = ""
            if arch0 and arch0.flash_attn == "triton" and m.env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE") != "TRUE":
                hint = "export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE  (flash-attn's Triton backend is the one for RDNA)"
            add("flash_attn", "ok", f"{ver} installed and supports this GPU", "", hint)

    # --- QLoRA
    bnb = t.get("bitsandbytes") or {}
    if not bnb.get("installed"):
        add("qlora", "ok", "QLoRA unavailable: bitsandbytes is not installed (LoRA works)",
            "QLoRA loads the base model in 4-bit through bitsandbytes",
            "pip install 'bitsandbytes>=0.49'  (or: pip install -e '.[qlora]'); or use LoRA instead")
    else:
        libs = bnb.get("libs") or []
        ver = f"bitsandbytes {bnb.get('version') or ''}".strip()
        if backend == "rocm":
            want = "rocm" + "".join(str(x) for x in _version_tuple(t.get("hip") or "")[:2])
            ok = any(lib.startswith(f"libbitsandbytes_{want}") for lib in libs)
            add("qlora", "ok" if ok else "warn", f"{ver}: " + ("has a ROCm build matching torch" if ok else
                f"no libbitsandbytes_{want}*.so for this ROCm torch"), f"libraries: {', '.join(libs) or 'none'}",
                "" if ok else "pip install -U 'bitsandbytes>=0.49' (ships ROCm builds); or use LoRA instead")
        elif backend == "cuda":
            want = "cuda" + "".join(str(x) for x in _version_tuple(t.get("cuda") or "")[:2])
            ok = any(lib.startswith(f"libbitsandbytes_{want}") for lib in libs)
            add("qlora", "ok" if ok else "warn", f"{ver}: " + ("has a CUDA build matching torch" if ok else
                f"no libbitsandbytes_{want}.so for this CUDA torch"), f"libraries: {', '.join(libs) or 'none'}",
                "" if ok else "pip install -U bitsandbytes; or use LoRA instead")
        else:
            add("qlora", "ok", f"{ver} installed; QLoRA needs a GPU, on the CPU use LoRA",
                "4-bit kernels on the CPU are slower than fp32 LoRA", "")

    # --- memory
    for i, g in enumerate(m.gpus):
        if not g.vram_bytes:
            continue
        free = g.vram_bytes - (g.vram_used_bytes or 0)
        lora, qlora = lora_fit(free)
        add(f"gpu{i}.vram", "ok" if lora >= 0.5 else "warn",
            f"GPU {i}: {_gb(g.vram_bytes)} VRAM, {_gb(free)} free: LoRA in bf16 fits models up to {_size_b(lora)} "
            f"parameters, QLoRA up to {_size_b(qlora)}",
            "rough: about 2.4 bytes per parameter for bf16 LoRA and 0.75 for QLoRA at short lengths and small "
            "batches (`roctune estimate` is the precise tool)", "" if lora >= 0.5 else "use a smaller model or QLoRA")

    # --- several GPUs
    vis = [g for idx, g in enumerate(amd) if idx in _visible_indices(m, "amd", len(amd))] + \
        [g for idx, g in enumerate(nv) if idx in _visible_indices(m, "nvidia", len(nv))]
    if len(vis) > 1:
        idx = [m.gpus.index(g) for g in vis]
        pairs = [(a, b) for k, a in enumerate(idx) for b in idx[k + 1:]]
        peer = t.get("peer")
        if peer and len(peer) == len(vis) and train_gpu:
            lacking = [(a, b) for (ka, a) in enumerate(idx) for (kb, b) in enumerate(idx)
                       if ka < kb and not (peer[ka][kb] and peer[kb][ka])]
            how = "torch.cuda.can_device_access_peer"
            kinds = ""
        else:
            lacking = [(a, b) for a, b in pairs if f"{a}-{b}" not in m.links]
            how = "the KFD topology" if amd else "unknown without torch"
            kinds = " (" + ", ".join(sorted({m.links[f'{a}-{b}'].upper() for a, b in pairs if f"{a}-{b}" in m.links})) \
                + ")" if any(f"{a}-{b}" in m.links for a, b in pairs) else ""
        names = ", ".join(f"{i}: {m.gpus[i].name}" for i in idx)
        gfxs = {m.gpus[i].gfx for i in idx if m.gpus[i].gfx}
        if not lacking:
            add("multi_gpu", "ok", f"{len(vis)} GPUs visible, all with direct peer access{kinds}",
                f"{names}; from {how}")
        else:
            add("multi_gpu", "warn", f"{len(vis)} GPUs visible; no direct peer access between "
                + ", ".join(f"{a}↔{b}" for a, b in lacking),
                f"{names}; from {how}. Multi-GPU training still works, but tensors travel through host memory",
                "check the IOMMU (kernel parameter iommu=pt) and BIOS settings (Above 4G decoding, Resizable BAR)"
                "; or train on one GPU: " + ("HIP_VISIBLE_DEVICES=0" if amd else "CUDA_VISIBLE_DEVICES=0"))
        if len(gfxs) > 1:
            add("multi_gpu.mixed", "warn", f"mixed architectures: {', '.join(sorted(gfxs))}",
                "one process runs one set of kernels (and one HSA_OVERRIDE_GFX_VERSION) for all GPUs",
                "pick GPUs of one kind: HIP_VISIBLE_DEVICES=<indices>")

    # --- libraries
    missing = [n for n, v in (t.get("packages") or {}).items() if v is None]
    if missing:
        add("packages", "fail", f"missing: {', '.join(missing)}", "roctune needs them for training",
            "pip install -e .")
    else:
        add("packages", "ok", ", ".join(f"{n} {v}" for n, v in (t.get("packages") or {}).items()), "")

    # --- no GPU at all
    if not m.gpus:
        add("cpu", "warn", "no GPU: training runs on the CPU",
            "a CPU trains roughly 10-50x slower than a mid-range GPU: fine for models up to ~0.5B parameters and "
            "small data sets (the bundled 135M demo takes minutes), impractical beyond ~1B",
            "use a machine with an AMD (ROCm) or NVIDIA GPU for larger models; on the CPU keep models small")
    return Report(out, m)


# ----------------------------------------------------------------------------------------- preflight


def preflight(device_requested: str = "auto", *, root: str = "/", torch_facts: dict | None = None) -> Report:
    """The checks `roctune train` runs before loading anything. Fast: no vendor tools, no GPU context.

    Raises EnvironmentProblem (with the fix) when a failing finding makes GPU training impossible,
    unless `device_requested == "cpu"`. Returns the Report otherwise (warnings are for the caller to show).
    """
    machine = gather(root, None, torch_facts, use_tools=False, full=False)
    report = diagnose(machine)
    blocking = report.blocking()
    # an unusable architecture blocks only when torch would pick the GPU (ROCm torch on that card)
    blocking += [f for f in report.findings if f.level == "fail" and f.id.endswith(".arch")]
    if blocking and device_requested != "cpu":
        f = blocking[0]
        more = f" ({len(blocking) - 1} more: run `roctune doctor`)" if len(blocking) > 1 else ""
        raise EnvironmentProblem(f"{f.message}. Fix: {f.fix}{more}. To train on the CPU anyway: --device cpu")
    return report


# ------------------------------------------------------------------------------------------- explain


@dataclass
class Explanation:
    id: str
    title: str
    cause: str
    fix: list[str]
    line: int  # 1-based line number of the first match
    evidence: str


def _find(lines: list[str], pattern: str, flags: int = re.I) -> tuple[int, str] | None:
    rx = re.compile(pattern, flags)
    for n, line in enumerate(lines, 1):
        if rx.search(line):
            return n, line.strip()[:240]
    return None


def explain(text: str) -> list[Explanation]:
    """Known failures in a training log, each with its cause and fix, in the order they appear."""
    lines = text.splitlines()
    found: list[Explanation] = []

    def hit(fid, title, cause, fix, where):
        if where:
            found.append(Explanation(fid, title, cause, fix, where[0], where[1]))

    oom = _find(lines, r"\b(HIP|CUDA) out of memory|OutOfMemoryError|hipErrorOutOfMemory")
    if oom:
        tried = re.search(r"Tried to allocate ([\d.]+ [GMK]iB)", text)
        cap = re.search(r"total capacity of ([\d.]+ [GMK]iB)", text)
        detail = "".join([f"; it tried to allocate {tried.group(1)}" if tried else "",
                          f" on a GPU of {cap.group(1)}" if cap else ""])
        hit("oom", "GPU out of memory", "the model, activations and optimizer state do not fit in VRAM" + detail,
            ["smaller micro-batch, same effective batch: --batch-size 1 --grad-accum 8",
             "shorter examples: --max-length 512 (or 256)",
             "--grad-checkpointing (recomputes activations: much less memory, ~30% slower)",
             "QLoRA: load the base model in 4-bit with bitsandbytes (see `roctune doctor`), or a smaller model",
             "fragmentation (reserved >> allocated): export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True "
             "(CUDA: PYTORCH_CUDA_ALLOC_CONF)"], oom)
    nobin = _find(lines, r"hipErrorNoBinaryForGpu|invalid device function|no kernel image is available|"
                         r"Cannot find Symbol|Unable to find code object|TensileLibrary.*GPU arch")
    if nobin:
        gfxs = sorted(set(re.findall(r"\b(gfx\d{3,4}[0-9a-f]?)\b", text)) & set(ARCHS))
        fixes = []
        for g in gfxs:
            a = ARCHS[g]
            if a.override:
                fixes.append(f"{g} ({a.cards}): export HSA_OVERRIDE_GFX_VERSION={a.override}")
            elif a.status == "unsupported":
                fixes.append(f"{g} ({a.cards}) is not supported by PyTorch ROCm: train with --device cpu")
        fixes += ["install the torch wheel built for your GPU: " + torch_install_line(rocm_wheel_index(None))
                  + " (NVIDIA: the CUDA index for your driver)",
                  "RDNA2 cards other than gfx1030: export HSA_OVERRIDE_GFX_VERSION=10.3.0; RDNA3 variants "
                  "missing from the build: 11.0.0",
                  "`roctune doctor` names your architecture and the exact setting"]
        hit("no_binary", "no GPU code for this architecture",
            "the GPU's architecture is not in the torch (or extension) build, so its kernels cannot load", fixes, nobin)
    flash = None
    if re.search(r"flash[_-]attn|flash_attention|ck_tile|aotriton", text, re.I):
        flash = _find(lines, r"Kernel not supported|HIP error|hipError\w+|CUDA error|FlashAttention only supports")
    kernel = flash or _find(lines, r"Kernel not supported")
    if kernel:
        hit("kernel", "attention / custom kernel failed on this GPU",
            "a fused kernel (flash-attn or another custom kernel) has no working path for this GPU, dtype or "
            "head size", ["use PyTorch's attention: --attn sdpa", "or remove the package: pip uninstall -y flash-attn",
                          "ROCm RDNA: flash-attn needs its Triton backend: export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE"],
            kernel)
    bnb = _find(lines, r"libbitsandbytes_rocm\w*\.so|libbitsandbytes_cuda\w*\.so.*(not found|No such)|"
                       r"compiled without GPU support|bitsandbytes.*(ROCm|HIP).*not (found|available|supported)")
    if bnb:
        hit("bitsandbytes", "bitsandbytes has no GPU library for this torch",
            "bitsandbytes loads libbitsandbytes_<backend><version>.so matching torch's ROCm/CUDA version; "
            "the installed package lacks it",
            ["pip install -U 'bitsandbytes>=0.49' (ships ROCm 6.4+/7.x and CUDA builds)",
             "or use LoRA instead of QLoRA (no bitsandbytes needed)"], bnb)
    trc = _find(lines, r"trust_remote_code|contains custom code which must be executed")
    if trc:
        hit("trust_remote_code", "the model needs its own code",
            "the model repository ships Python code (a custom architecture) that transformers does not include",
            ["if you trust the repository: roctune train --trust-remote-code ...",
             "or upgrade transformers (pip install -U transformers): many such models became native",
             "or pick a model transformers supports natively"], trc)
    nogpu = _find(lines, r"torch\.cuda\.is_available\(\)\W*(is |was |returned |returns |==\s*)?False|"
                         r"No (CUDA|HIP) GPUs are available|no ROCm-capable device|hipErrorNoDevice|"
                         r"Found no NVIDIA driver|CUDA driver initialization failed|this torch is a CPU-only build")
    if nogpu:
        hit("no_gpu", "torch sees no GPU",
            "a CPU-only torch, a driver that is not loaded, missing /dev/kfd or /dev/dri permissions, or "
            "*_VISIBLE_DEVICES hiding the GPUs",
            ["run `roctune doctor`: it names which one and the exact fix",
             "AMD: sudo usermod -aG render,video $USER, then log out and in",
             "containers: docker run " + CONTAINER_FLAGS + " (NVIDIA: --gpus all)"], nogpu)
    coll = _find(lines, r"\b(NCCL|RCCL)\b.*(error|WARN|fail|timeout)|nccl\w*Error|"
                        r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*(error|timeout)", re.I)
    if coll:
        hit("collective", "multi-GPU communication (NCCL/RCCL) failed",
            "the GPUs could not exchange data: peer access blocked (IOMMU/ACS), too little shared memory in a "
            "container, mismatched versions on the ranks, or one rank crashed first",
            ["see the cause: NCCL_DEBUG=INFO (RCCL reads the same variable)",
             "test without peer-to-peer: NCCL_P2P_DISABLE=1",
             "containers: docker run --ipc=host --shm-size 16g ...",
             "bare metal AMD: kernel parameter iommu=pt; `roctune doctor` shows peer access",
             "rule out the rest: train on one GPU (HIP_VISIBLE_DEVICES=0 / CUDA_VISIBLE_DEVICES=0)"], coll)
    found.sort(key=lambda e: e.line)
    return found


def read_log(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"--explain: cannot read {path}: {e.strerror}") from e
