"""Reading a machine's facts from files: GPUs from sysfs and the KFD topology, device nodes and who may
open them, users and groups, ROCm and NVIDIA driver versions, container markers, environment variables,
and names/memory from vendor tools (rocminfo, nvidia-smi) when they are installed.

Every file is read under a `root`, so that a mounted system image (or a tree the tests build) can be
probed like the running machine. Missing or unreadable files are facts too (None / empty), never errors.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import stat
import subprocess

from roctune.hardware.facts import Gpu, Machine
from roctune.hardware.gpus import AMD_VENDOR, NVIDIA_VENDOR, gfx_name

log = logging.getLogger(__name__)


def path_under(root: str, rel: str) -> str:
    return os.path.join(root, rel.lstrip("/"))


def read(root: str, rel: str) -> str | None:
    """A small text file under `root`, stripped; None when it cannot be read."""
    try:
        with open(path_under(root, rel), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def to_int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _properties(text: str | None) -> dict[str, int]:
    """A KFD `properties` file ("name value" per line) as a dict of its integer values."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------------- users, nodes


def groups_db(root: str) -> tuple[dict[str, tuple[int, list[str]]], dict[str, tuple[int, int]]]:
    """/etc/group as {name: (gid, members)} and /etc/passwd as {user: (uid, primary gid)}."""
    groups: dict[str, tuple[int, list[str]]] = {}
    for line in (read(root, "/etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit():
            groups[parts[0]] = (int(parts[2]), [m for m in parts[3].split(",") if m])
    users: dict[str, tuple[int, int]] = {}
    for line in (read(root, "/etc/passwd") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            users[parts[0]] = (int(parts[2]), int(parts[3]))
    return groups, users


def current_user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return ""


def device_node(root: str, rel: str, live_access: bool, user: str, user_groups: list[str],
                groups: dict, users: dict) -> dict | None:
    """{"path", "mode", "group", "accessible", "world"} of a device node; None when it does not exist.

    On the live machine for its own user, the kernel answers (os.access); otherwise the mode bits are
    judged against the user's groups as /etc/group lists them (root may open anything)."""
    path = path_under(root, rel)
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


def in_container(root: str) -> bool:
    if os.path.exists(path_under(root, "/.dockerenv")) or os.path.exists(path_under(root, "/run/.containerenv")):
        return True
    cgroup = read(root, "/proc/1/cgroup") or ""
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))


def read_env(root: str, live: bool, env: dict | None) -> dict[str, str]:
    """The environment the judgement uses: `env` when given (tests), else this process's, on top of a
    mounted image's /etc/environment (the variables its users would get)."""
    if env is not None:
        return dict(env)
    out: dict[str, str] = {}
    if not live:
        for line in (read(root, "/etc/environment") or "").splitlines():
            m = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
            if m:
                out[m.group(1)] = m.group(2).strip().strip("\"'")
    out.update(os.environ)
    return out


def rocm_version(root: str) -> str | None:
    """The installed ROCm version ("6.4.1") from /opt/rocm, else the newest /opt/rocm-X.Y.Z."""
    version = read(root, "/opt/rocm/.info/version")
    if version is None:
        for f in sorted(glob.glob(path_under(root, "/opt/rocm-*/.info/version")), reverse=True):
            version = read("/", f)
            break
    return re.match(r"[\d.]+", version).group(0).rstrip(".") if version and re.match(r"\d", version) else None


def nvidia_driver(root: str) -> str | None:
    """The loaded NVIDIA kernel module's version; "unknown" when loaded but unparsable; None when not loaded."""
    text = read(root, "/proc/driver/nvidia/version")
    if text is None:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return found.group(1) if found else "unknown"


def wsl_facts(root: str) -> dict:
    """WSL2 facts: {} on other machines; else {"dxg": /dev/dxg (the GPU bridge to the Windows driver),
    "kernel": the WSL kernel line of /proc/version, "rocm_runtime": ROCm's WSL runtime (package
    hsa-runtime-rocr4wsl-amdgpu) is installed, "cuda_lib": the Windows NVIDIA driver's libcuda is mapped in}."""
    version = read(root, "/proc/version") or ""
    dxg = os.path.exists(path_under(root, "/dev/dxg"))
    wsl_kernel = re.search(r"microsoft|WSL", version, re.I) is not None
    if not (dxg or wsl_kernel):
        return {}
    rocr4wsl = "Package: hsa-runtime-rocr4wsl-amdgpu" in (read(root, "/var/lib/dpkg/status") or "")
    return {"dxg": dxg, "kernel": version.split("(")[0].strip() if wsl_kernel else "",
            "rocm_runtime": rocr4wsl, "cuda_lib": os.path.exists(path_under(root, "/usr/lib/wsl/lib/libcuda.so"))}


def has_nvidia_nodes(root: str) -> bool:
    return os.path.exists(path_under(root, "/dev/nvidiactl")) or bool(glob.glob(path_under(root, "/dev/nvidia[0-9]*")))


# --------------------------------------------------------------------------------------------- GPUs


def _drm_cards(root: str) -> dict[str, dict]:
    """PCI facts of each /sys/class/drm/cardN: vendor, device id, VRAM total/used, render node minor."""
    cards = {}
    for vendor_file in sorted(glob.glob(path_under(root, "/sys/class/drm/card*/device/vendor"))):
        card = vendor_file.split(os.sep)[-3]
        if not re.fullmatch(r"card\d+", card):
            continue  # connectors (card0-DP-1) have no device of their own
        dev = os.path.dirname(vendor_file)
        renders = glob.glob(os.path.join(dev, "drm", "renderD*"))
        cards[card] = {
            "vendor": to_int(read("/", vendor_file), 16),
            "device": read("/", os.path.join(dev, "device")),
            "vram": to_int(read("/", os.path.join(dev, "mem_info_vram_total"))),
            "vram_used": to_int(read("/", os.path.join(dev, "mem_info_vram_used"))),
            "render_minor": to_int(os.path.basename(renders[0])[len("renderD"):]) if renders else None,
        }
    return cards


def _kfd_gpus(root: str, kfd_dir: str, cards: dict, used_cards: set[str]) -> tuple[list[Gpu], dict[int, int]]:
    """AMD GPUs from the KFD topology (the compute driver's view), matched to their DRM card by render
    minor. Returns the GPUs and {KFD node: index in the list}."""
    gpus: list[Gpu] = []
    node_to_gpu: dict[int, int] = {}
    nodes = sorted((int(n) for n in os.listdir(kfd_dir) if n.isdigit()), key=int) if os.path.isdir(kfd_dir) else []
    for n in nodes:
        props = _properties(read(root, f"/sys/class/kfd/kfd/topology/nodes/{n}/properties"))
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
        device_id = props.get("device_id") or to_int(info.get("device"), 16)
        node_to_gpu[n] = len(gpus)
        gpus.append(Gpu("amd", "", gfx=gfx, vram_bytes=info.get("vram"), vram_used_bytes=info.get("vram_used"),
                        device_id=f"0x{device_id:04x}" if device_id else None, card=card,
                        render_minor=minor, kfd_node=n))
    return gpus, node_to_gpu


def _peer_links(kfd_dir: str, node_to_gpu: dict[int, int]) -> dict[str, str]:
    """Direct GPU-to-GPU links (XGMI, or PCIe peer-to-peer) from the KFD topology: {"i-j": kind}."""
    links: dict[str, str] = {}
    for n, gi in node_to_gpu.items():
        for kind in ("io_links", "p2p_links"):
            for prop_file in glob.glob(os.path.join(kfd_dir, str(n), kind, "*", "properties")):
                props = _properties(read("/", prop_file))
                to = props.get("node_to")
                if to in node_to_gpu and to != n:
                    a, b = sorted((gi, node_to_gpu[to]))
                    kind_name = "xgmi" if props.get("type") == 11 else "pcie"  # KFD link type 11 is XGMI
                    if links.get(f"{a}-{b}") != "xgmi":  # the fastest link between two GPUs is the one to show
                        links[f"{a}-{b}"] = kind_name
    return links


def sysfs_gpus(root: str) -> tuple[list[Gpu], bool, dict]:
    """GPUs under `root` (KFD nodes first, then other AMD/NVIDIA DRM cards), whether /sys/class/kfd
    exists (amdgpu's compute part is loaded), and the direct links between GPUs."""
    kfd_dir = path_under(root, "/sys/class/kfd/kfd/topology/nodes")
    kfd_sysfs = os.path.isdir(path_under(root, "/sys/class/kfd"))
    cards = _drm_cards(root)
    used_cards: set[str] = set()
    gpus, node_to_gpu = _kfd_gpus(root, kfd_dir, cards, used_cards)
    for card, info in cards.items():
        if card in used_cards or info["vendor"] not in (AMD_VENDOR, NVIDIA_VENDOR):
            continue
        device_id = to_int(info.get("device"), 16)
        gpus.append(Gpu("amd" if info["vendor"] == AMD_VENDOR else "nvidia", "", vram_bytes=info.get("vram"),
                        vram_used_bytes=info.get("vram_used"), device_id=f"0x{device_id:04x}" if device_id else None,
                        card=card, render_minor=info.get("render_minor")))
    return gpus, kfd_sysfs, _peer_links(kfd_dir, node_to_gpu)


# ------------------------------------------------------------------------------------- vendor tools


def _run_tool(args: list[str], timeout: float = 8.0) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("%s did not run: %s", args[0], e)
        return None
    return out.stdout if out.returncode == 0 else None


def tools_facts(machine: Machine) -> None:
    """Names and memory from vendor tools when installed (live machine only; never required)."""
    for tool in ("rocminfo", "amd-smi", "rocm-smi", "nvidia-smi"):
        path = shutil.which(tool)
        if path:
            machine.tools[tool] = path
    if "rocminfo" in machine.tools and machine.amd():
        _rocminfo_names(machine)
    if "nvidia-smi" in machine.tools and machine.nvidia():
        _nvidia_smi_facts(machine)


def _rocminfo_names(machine: Machine) -> None:
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


def _nvidia_smi_facts(machine: Machine) -> None:
    text = _run_tool(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,compute_cap",
                      "--format=csv,noheader,nounits"]) or ""
    for gpu, line in zip(machine.nvidia(), [ln for ln in text.splitlines() if ln.strip()]):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpu.name = gpu.name or parts[0]
            gpu.vram_bytes = gpu.vram_bytes or (to_int(parts[1]) or 0) * 2**20 or None
            gpu.vram_used_bytes = gpu.vram_used_bytes or (to_int(parts[2]) or 0) * 2**20 or None
            if len(parts) >= 4 and not gpu.compute_capability:
                gpu.compute_capability = parts[3]
