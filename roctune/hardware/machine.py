"""`gather(root, user, torch_facts)`: all facts of the machine under `root` in one `Machine`: GPUs, device
nodes and whether `user` may open them, driver versions, container, environment, torch and libraries.

GPU names and memory come from the best source present: torch (when it describes these GPUs), then the
vendor tools (live machine only), then roctune's tables by PCI id.
"""
from __future__ import annotations

import glob
import os

from roctune.hardware import probe
from roctune.hardware.facts import Gpu, Machine
from roctune.hardware.gpus import AMD_DEVICE_NAMES, ARCHS
from roctune.hardware.torchfacts import complete_torch_facts, live_torch_facts


def gather(root: str = "/", user: str | None = None, torch_facts: dict | None = None, *,
           env: dict | None = None, use_tools: bool = True, full: bool = True) -> Machine:
    """Read the facts of the machine under `root`. `torch_facts` replaces the running torch (simulation).

    `use_tools`: run rocminfo / nvidia-smi when present; `full=False`: skip what initialises the GPU
    runtime (preflight)."""
    root = os.path.abspath(root or "/")
    live = root == "/"
    m = Machine(root=root, live=live)
    m.env = probe.read_env(root, live, env)
    own_user = user is None
    groups, users = _user_facts(m, user, own_user)
    # the kernel can say what this process may open; for another user or an image, judge the mode bits
    live_access = live and own_user
    m.gpus, m.kfd_sysfs, m.links = probe.sysfs_gpus(root)
    m.dev_kfd = probe.device_node(root, "/dev/kfd", live_access, m.user, m.user_groups, groups, users)
    for p in sorted(glob.glob(probe.path_under(root, "/dev/dri/renderD*"))):
        node = probe.device_node(root, "/dev/dri/" + os.path.basename(p), live_access, m.user, m.user_groups,
                                 groups, users)
        if node:
            m.render_nodes.append(node)
    m.dev_nvidia = probe.has_nvidia_nodes(root)
    m.rocm_version = probe.rocm_version(root)
    m.nvidia_driver = probe.nvidia_driver(root)
    m.container = probe.in_container(root)
    m.kernel_cmdline = probe.read(root, "/proc/cmdline")
    m.wsl = probe.wsl_facts(root)
    m.torch = complete_torch_facts(torch_facts) if torch_facts is not None else live_torch_facts(full=full)
    _names_from_torch(m)
    if live and use_tools:
        probe.tools_facts(m)
    _names_from_tables(m)
    return m


def _user_facts(m: Machine, user: str | None, own_user: bool) -> tuple[dict, dict]:
    """Fill the user and their groups (from /etc/group and /etc/passwd under the root; on the live machine
    for its own user, also the groups this process really has). Returns the group and user tables."""
    groups, users = probe.groups_db(m.root)
    m.user = user or probe.current_user()
    m.user_groups = sorted(name for name, (_, members) in groups.items() if m.user in members)
    if m.user in users:
        primary = users[m.user][1]
        m.user_groups = sorted(set(m.user_groups) | {n for n, (gid, _) in groups.items() if gid == primary})
    m.user_known = m.user in users or bool(m.user_groups) or m.user == "root"
    if m.live and own_user and hasattr(os, "getgroups"):
        # a user added to `render` keeps the old groups until they log in again: this tells them apart
        gid_names = {gid: name for name, (gid, _) in groups.items()}
        m.process_groups = sorted({gid_names.get(g, str(g)) for g in os.getgroups()})
    return groups, users


def _names_from_torch(m: Machine) -> None:
    """Names, memory and compute capability from torch, when it sees exactly the GPUs of its vendor."""
    devices = m.torch.get("devices") or []
    backend_vendor = {"rocm": "amd", "cuda": "nvidia"}.get(m.torch.get("backend"))
    visible = [g for g in m.gpus if g.vendor == backend_vendor]
    if not devices or len(devices) != len(visible):
        return  # *_VISIBLE_DEVICES hides some: the order cannot be matched safely
    for g, d in zip(visible, devices):
        g.name = g.name or d.get("name") or ""
        g.vram_bytes = g.vram_bytes or d.get("total_memory")
        if d.get("free_memory") is not None and g.vram_bytes and g.vram_used_bytes is None:
            g.vram_used_bytes = g.vram_bytes - d["free_memory"]
        if g.vendor == "nvidia" and d.get("capability"):
            g.compute_capability = str(d["capability"])


def _names_from_tables(m: Machine) -> None:
    """A name for every GPU still without one."""
    for g in m.gpus:
        g.name = g.name or table_name(g)


def table_name(g: Gpu) -> str:
    """A GPU's name from roctune's tables: the AMD card by PCI id, its family, or the PCI id."""
    did = probe.to_int(g.device_id, 16) if g.device_id else None
    if g.vendor == "amd":
        arch = ARCHS.get(g.gfx or "")
        return AMD_DEVICE_NAMES.get(did or -1) or (f"AMD {arch.family} GPU" if arch else "AMD GPU")
    return f"NVIDIA GPU [10de:{did:04x}]" if did else "NVIDIA GPU"
