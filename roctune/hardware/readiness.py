"""Can torch train on this machine's GPU? The judgements that decide it, from a `Machine`'s facts alone:
the torch build against the hardware, AMD device nodes and permissions, the NVIDIA driver, GPUs hidden
by *_VISIBLE_DEVICES, whether torch sees a GPU, each GPU's architecture (and HSA_OVERRIDE_GFX_VERSION),
and the no-GPU case. Preflight runs exactly these; `roctune doctor` runs them and its own advice.

Each `check_*` appends findings to a `Findings` list, in the order the report shows them.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.hardware.facts import Gpu, Machine
from roctune.hardware.gpus import ARCHS, Arch, gfx_major, parse_override
from roctune.hardware.report import Findings
from roctune.hardware.text import Text
from roctune.hardware.wheels import cuda_wheel_index, rocm_wheel_index, torch_install_line, version_tuple

CONTAINER_FLAGS = "--device /dev/kfd --device /dev/dri --group-add video --group-add render"


@dataclass
class Context:
    """What every check derives from the machine, computed once."""
    m: Machine
    t: dict  # torch facts
    backend: str  # "rocm" | "cuda" | "cpu" | "none"
    amd: list[Gpu]
    nv: list[Gpu]
    torch_desc: Text  # "torch 2.9.0 (ROCm 6.4 build)"
    states: dict  # GPU index -> (state, override value), see arch_state
    amd_usable: list[Gpu]  # AMD GPUs PyTorch ROCm can run on (or whose architecture is unknown)
    train_gpu: bool  # training would run on a GPU
    gpu0: Gpu | None  # the GPU training would use
    arch0: Arch | None  # its architecture, for an AMD GPU


def context(m: Machine) -> Context:
    t = m.torch
    backend = t.get("backend", "cpu")
    label = {"rocm": f"ROCm {t.get('hip') or ''}".strip(), "cuda": f"CUDA {t.get('cuda') or ''}".strip(),
             "cpu": Text("CPU-only")}.get(backend, backend)
    states = {i: arch_state(g.gfx, m) for i, g in enumerate(m.gpus) if g.vendor == "amd" and g.gfx}
    amd_usable = [g for i, g in enumerate(m.gpus) if g.vendor == "amd" and
                  (not g.gfx or states[i][0] not in ("unsupported",))]
    train_gpu = backend in ("rocm", "cuda") and bool(t.get("cuda_available"))
    gpu0 = next((g for g in m.gpus if g.vendor == {"rocm": "amd", "cuda": "nvidia"}.get(backend)), None) \
        if train_gpu else None
    arch0 = ARCHS.get(gpu0.gfx or "") if gpu0 and gpu0.vendor == "amd" else None
    return Context(m, t, backend, m.amd(), m.nvidia(), Text("torch {version} ({build} build)",
                                                            version=t.get('version') or '?', build=label),
                   states, amd_usable, train_gpu, gpu0, arch0)


def arch_state(gfx: str, m: Machine) -> tuple[str, str]:
    """How torch runs on `gfx`: ('native'|'override'|'missing'|'unsupported'|'unknown', override value).

    A ROCm torch's own arch list is the truth when known; otherwise the table describes the official wheels."""
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


def visible_env(m: Machine, vendor: str) -> tuple[str, str] | None:
    """The first *_VISIBLE_DEVICES variable set for this vendor's runtime, as (name, value)."""
    keys = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if vendor == "amd" \
        else ("CUDA_VISIBLE_DEVICES",)
    for k in keys:
        if k in m.env:
            return k, m.env[k]
    return None


def visible_indices(m: Machine, vendor: str, count: int) -> list[int]:
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


# ------------------------------------------------------------------------------------------- checks


def check_torch_build(c: Context, out: Findings) -> None:
    """The torch build against the hardware: a CPU torch on a GPU machine is the commonest problem."""
    m, t = c.m, c.t
    if c.backend == "none":
        index = rocm_wheel_index(m.rocm_version) if c.amd else "https://download.pytorch.org/whl/cpu"
        out.add("torch.build", "fail", Text("torch is not installed"), t.get("error", ""),
                f"make setup  (or: pip install torch --index-url {index})")
    elif c.amd and c.backend != "rocm":
        index = rocm_wheel_index(m.rocm_version)
        why = (Text("PyTorch reaches AMD GPUs only through its ROCm build; the wheel index is matched to the "
                    "installed ROCm {rocm}", rocm=m.rocm_version) if m.rocm_version else
               Text("PyTorch reaches AMD GPUs only through its ROCm build (the wheels bundle the ROCm runtime, so "
                    "a system ROCm install is optional)"))
        if c.amd_usable:
            out.add("torch.build", "fail", Text("AMD GPU present but {torch} cannot use it", torch=c.torch_desc), why,
                    torch_install_line(index))
        else:  # a ROCm torch would not help: the CPU build is the right one
            out.add("torch.build", "warn", Text("{torch}; the AMD GPU here is not supported by PyTorch ROCm, so "
                    "training runs on the CPU", torch=c.torch_desc), why,
                    Text("nothing to install: use --device cpu (see the architecture line)"))
    elif c.nv and not c.amd and c.backend != "cuda":
        why = (Text("PyTorch reaches NVIDIA GPUs only through its CUDA build; index chosen for driver {driver}",
                    driver=m.nvidia_driver) if m.nvidia_driver else
               Text("PyTorch reaches NVIDIA GPUs only through its CUDA build"))
        out.add("torch.build", "fail", Text("NVIDIA GPU present but {torch} cannot use it", torch=c.torch_desc), why,
                torch_install_line(cuda_wheel_index(m.nvidia_driver)))
    elif not m.gpus and c.backend != "cpu":
        out.add("torch.build", "ok", c.torch_desc, Text("no GPU found on this machine; it will run on the CPU"))
    else:
        out.add("torch.build", "ok", c.torch_desc,
                Text("matches the hardware") if m.gpus else Text("no GPU on this machine"))


def check_amd_driver(c: Context, out: Findings) -> None:
    """AMD: the KFD device node, a render node, who may open them, and the installed ROCm."""
    m = c.m
    if not c.amd:
        return
    if m.dev_kfd is None:
        _missing_kfd(m, out)
    if not m.render_nodes and m.dev_kfd is not None:
        out.add("amd.render", "fail", Text("no /dev/dri/renderD* node"),
                Text("HIP opens the GPU's render node as well as /dev/kfd"),
                Text("in a container: docker run {flags}; on the host: sudo udevadm trigger or reboot",
                     flags=CONTAINER_FLAGS))
    _amd_access(m, out)
    if m.rocm_version:
        out.add("amd.rocm", "ok", Text("ROCm {version} installed", version=m.rocm_version),
                Text("PyTorch wheels bundle their own ROCm runtime; the system one matters for tools and for "
                     "building extensions"))


def _missing_kfd(m: Machine, out: Findings) -> None:
    # three causes with three fixes: a container without the devices, no driver, or no udev node
    if m.container:
        out.add("amd.kfd", "fail", Text("/dev/kfd is missing in this container"),
                Text("the container was started without the GPU device nodes"),
                Text("restart the container with: docker run {flags} ... (podman: the same --device flags)",
                     flags=CONTAINER_FLAGS))
    elif not m.kfd_sysfs:
        out.add("amd.kfd", "fail", Text("/dev/kfd is missing: the amdgpu compute driver (KFD) is not loaded"),
                Text("an AMD GPU is on the PCI bus but /sys/class/kfd does not exist"),
                Text("sudo modprobe amdgpu; if that fails install the driver (`sudo amdgpu-install --usecase=dkms`) "
                     "and reboot; `sudo dmesg | grep -i amdgpu` shows why it did not load"))
    else:
        out.add("amd.kfd", "fail", Text("/dev/kfd is missing although the amdgpu driver is loaded"),
                Text("udev did not create the device node"),
                Text("sudo udevadm trigger (or reboot); in a container: docker run {flags}", flags=CONTAINER_FLAGS))


def _amd_access(m: Machine, out: Findings) -> None:
    nodes = ([m.dev_kfd] if m.dev_kfd else []) + m.render_nodes[:1]
    blocked = [n for n in nodes if not n["accessible"]]
    if nodes and not m.user_known:
        out.add("amd.access", "warn", Text("user {user} is not in {root}/etc/passwd or /etc/group", user=repr(m.user),
                                           root=m.root.rstrip('/')),
                Text("group membership cannot be judged"), Text("check the name given with --user"))
    elif blocked:
        _blocked(m, out, blocked)
    elif nodes:
        out.add("amd.access", "ok", Text("{user} can open {nodes}", user=m.user,
                                         nodes=Text.join(" and ", (n["path"] for n in nodes))),
                Text("world-accessible") if all(n["world"] for n in nodes) else
                Text("member of {groups}", groups=", ".join(g for g in m.user_groups if g in ('render', 'video'))
                     or Text("the owning group")))


def _blocked(m: Machine, out: Findings, blocked: list[dict]) -> None:
    """Device nodes this user cannot open: a session older than the group change, or groups not joined."""
    need = sorted({n["group"] for n in blocked if n["group"]} or {"render"})
    in_db = [g for g in need if g in m.user_groups]
    names = Text.join(", ", (Text("{path} (group {group}, mode {mode})", path=n["path"], group=n["group"] or "?",
                                  mode=n["mode"]) for n in blocked))
    if in_db and m.process_groups is not None and not set(need) & set(m.process_groups):
        out.add("amd.access", "fail", Text("{user} was added to {groups} but this session predates it", user=m.user,
                                           groups="/".join(need)),
                Text("cannot open {nodes}; group changes apply to new logins only", nodes=names),
                Text("log out and in (or reboot); for this shell only: newgrp render"))
    else:
        fix = Text("sudo usermod -aG render,video {user}, then log out and in", user=m.user)
        if m.container:
            fix = Text("{fix} (in a container: docker run ... --group-add render --group-add video)", fix=fix)
        out.add("amd.access", "fail", Text("user {user} cannot open {nodes}", user=m.user, nodes=names),
                Text("{user} is in groups [{groups}], not in {need}", user=m.user,
                     groups=", ".join(m.user_groups) or Text("none"), need=Text.join(" or ", need)), fix)


def check_nvidia_driver(c: Context, out: Findings) -> None:
    m = c.m
    if not c.nv or c.amd:
        return
    if m.nvidia_driver is None:
        fix = (Text("restart the container with --gpus all (NVIDIA Container Toolkit)") if m.container else
               Text("install the NVIDIA driver (e.g. `sudo ubuntu-drivers install`), reboot, then check `nvidia-smi`"))
        out.add("nvidia.driver", "fail", Text("NVIDIA GPU present but the NVIDIA driver is not loaded"),
                Text("/proc/driver/nvidia/version does not exist"), fix)
    else:
        out.add("nvidia.driver", "ok", Text("NVIDIA driver {version}", version=m.nvidia_driver), "")


def check_visibility(c: Context, out: Findings) -> None:
    """*_VISIBLE_DEVICES set so that the runtime shows no GPU at all."""
    for vendor, gpus in (("amd", c.amd), ("nvidia", c.nv)):
        hidden = visible_env(c.m, vendor)
        if gpus and hidden and not visible_indices(c.m, vendor, len(gpus)):
            out.add("visible", "fail", Text("{name}={value} hides every GPU", name=hidden[0], value=repr(hidden[1])),
                    Text("the runtime only shows the GPUs listed there"),
                    Text("unset {name}  (or list GPUs: {name}=0)", name=hidden[0]))


def check_torch_sees_gpu(c: Context, out: Findings) -> None:
    t = c.t
    if c.backend in ("rocm", "cuda") and c.m.gpus and not t.get("cuda_available"):
        if not any(f.level == "fail" for f in out):  # an earlier failure already names the cause
            out.add("torch.gpu", "fail", Text("{torch} sees no GPU (torch.cuda.is_available() is False)",
                                              torch=c.torch_desc),
                    t.get("error") or Text("driver, device permissions or visibility env vars"),
                    Text("run `roctune doctor --json` on the host and compare; check `rocminfo`/`nvidia-smi` works "
                         "for this user"))
    elif c.backend in ("rocm", "cuda") and t.get("cuda_available"):
        n = t.get("device_count") or 0
        out.add("torch.gpu", "ok", Text("torch sees {n} GPUs", n=n) if n != 1 else Text("torch sees 1 GPU"),
                ", ".join(d.get("name", "?") for d in t.get("devices") or []))


def check_amd_arch(c: Context, out: Findings) -> None:
    """Each AMD GPU's architecture: runs natively, through an override, or not at all; and whether
    HSA_OVERRIDE_GFX_VERSION is set to something that hurts."""
    for i, g in enumerate(c.m.gpus):
        if g.vendor != "amd" or not g.gfx:
            continue
        arch = ARCHS.get(g.gfx)
        desc = f"GPU {i}: {g.name} ({g.gfx}{', ' + arch.family if arch else ''})"
        _override_finding(c, out, i, g, arch)
        _arch_finding(c, out, i, g, arch, desc)


def _override_finding(c: Context, out: Findings, i: int, g: Gpu, arch: Arch | None) -> None:
    fid = f"gpu{i}.arch"
    override = c.m.env.get("HSA_OVERRIDE_GFX_VERSION")
    override_gfx = parse_override(override)
    state, value = c.states[i]
    unset = Text("unset HSA_OVERRIDE_GFX_VERSION")
    if arch and arch.bad_override and override_gfx and override_gfx == parse_override(arch.bad_override):
        out.add(fid + ".override", "fail" if c.backend == "rocm" else "warn",
                Text("HSA_OVERRIDE_GFX_VERSION={override} is known to fail on the {gfx} ({family})",
                     override=override, gfx=g.gfx, family=arch.family),
                Text("the {kernels} kernels use instructions the {gfx} lacks: crashes (illegal instruction, memory "
                     "access fault) or silently wrong numbers", kernels=override_gfx, gfx=g.gfx),
                Text("unset HSA_OVERRIDE_GFX_VERSION; train with --device cpu"))
    elif override is not None and override_gfx is None:
        out.add(fid + ".override", "warn", Text("HSA_OVERRIDE_GFX_VERSION={override} is not a version like 10.3.0",
                                                override=repr(override)),
                Text("the ROCm runtime ignores or misreads it"), unset)
    elif override_gfx and override_gfx != g.gfx:
        if gfx_major(override_gfx) != gfx_major(g.gfx):
            good = f"export HSA_OVERRIDE_GFX_VERSION={arch.override}" if arch and arch.override and \
                state == "override" else unset
            out.add(fid + ".override", "warn", Text("HSA_OVERRIDE_GFX_VERSION={override} makes the {gfx} pose as "
                    "{other}, a different generation", override=override, gfx=g.gfx, other=override_gfx),
                    Text("kernels built for another generation crash or compute garbage"), good)
        elif state == "native":
            out.add(fid + ".override", "warn", Text("HSA_OVERRIDE_GFX_VERSION={override} is set but {gfx} is "
                    "supported natively", override=override, gfx=g.gfx),
                    Text("the override makes ROCm load kernels for another chip"), unset)
        elif state == "override" and value and parse_override(value) != override_gfx:
            out.add(fid + ".override", "warn", Text("HSA_OVERRIDE_GFX_VERSION={override} is not the value for {gfx}",
                                                    override=override, gfx=g.gfx),
                    Text("{gfx} runs with the {kernels} kernels", gfx=g.gfx, kernels=parse_override(value)),
                    f"export HSA_OVERRIDE_GFX_VERSION={value}")


def _arch_finding(c: Context, out: Findings, i: int, g: Gpu, arch: Arch | None, desc: str) -> None:
    # without a ROCm torch the GPU is not used yet, so an architecture problem is a warning, not a failure
    fid = f"gpu{i}.arch"
    state, value = c.states[i]
    t, rocm_torch = c.t, c.backend == "rocm"
    note = Text(arch.note) if arch and arch.note else ""
    override_gfx = parse_override(c.m.env.get("HSA_OVERRIDE_GFX_VERSION"))
    if state == "native":
        where = Text("this torch build has kernels for it") if rocm_torch and t.get("arch_list") else \
            Text("supported by the official PyTorch ROCm wheels")
        out.add(fid, "ok", Text("{gpu}: {where}", gpu=desc, where=where), note)
    elif state == "override":
        if override_gfx == parse_override(value):
            out.add(fid, "ok", Text("{gpu}: runs through HSA_OVERRIDE_GFX_VERSION={value}", gpu=desc, value=value),
                    Text("not in the official wheels; the {kernels} kernels work on it", kernels=parse_override(value)))
        else:
            out.add(fid, "fail" if rocm_torch else "warn", Text("{gpu}: needs HSA_OVERRIDE_GFX_VERSION={value}",
                                                                gpu=desc, value=value),
                    Text("the official PyTorch ROCm wheels have no {gfx} kernels; it runs the {kernels} ones (without "
                         "the override: hipErrorNoBinaryForGpu)", gfx=g.gfx, kernels=parse_override(value)),
                    Text("export HSA_OVERRIDE_GFX_VERSION={value}  (add it to ~/.bashrc)", value=value))
    elif state == "unsupported":
        out.add(fid, "fail" if rocm_torch else "warn",
                Text("{gpu}: not supported by the official PyTorch ROCm wheels", gpu=desc),
                Text("{note}; no override makes current wheels run on it. What remains: training on the CPU, or an "
                     "old ROCm/PyTorch combination built for it (unsupported)", note=note),
                "roctune train --device cpu ...")
    elif state == "missing":
        arch_list = ", ".join(t.get("arch_list") or [])
        out.add(fid, "fail" if rocm_torch else "warn",
                Text("{gpu}: this torch build has no kernels for {gfx}", gpu=desc, gfx=g.gfx),
                Text("its arch list is {archs}; {note}", archs=arch_list, note=note) if note else
                Text("its arch list is {archs}", archs=arch_list),
                torch_install_line(rocm_wheel_index(None)))
    else:
        out.add(fid, "warn", Text("{gpu}: an architecture roctune does not know", gpu=desc),
                Text("whether PyTorch ROCm supports it is not known here"),
                Text("check `rocminfo` and the ROCm support matrix"))


def check_nvidia_arch(c: Context, out: Findings) -> None:
    """NVIDIA compute capability: current CUDA wheels need 7.0 (Volta) or newer."""
    for i, g in enumerate(c.m.gpus):
        if g.vendor == "nvidia" and g.compute_capability:
            ok = version_tuple(g.compute_capability) >= (7, 0)
            out.add(f"gpu{i}.arch", "ok" if ok else "warn",
                    Text("GPU {i}: {name} (compute capability {cc})", i=i, name=g.name, cc=g.compute_capability),
                    "" if ok else Text("current CUDA wheels need 7.0 or newer"),
                    "" if ok else "roctune train --device cpu ...")


def check_no_gpu(c: Context, out: Findings) -> None:
    if not c.m.gpus and not c.train_gpu:  # under WSL2 sysfs shows no GPU, but torch may see one
        out.add("cpu", "warn", Text("no GPU: training runs on the CPU"),
                Text("a CPU trains roughly 10-50x slower than a mid-range GPU: fine for models up to ~0.5B parameters "
                     "and small data sets (the bundled 135M demo takes minutes), impractical beyond ~1B"),
                Text("use a machine with an AMD (ROCm) or NVIDIA GPU for larger models; on the CPU keep models small"))


# The readiness checks in report order (the no-GPU finding comes last, after doctor's own checks).
CHECKS = (check_torch_build, check_amd_driver, check_nvidia_driver, check_visibility, check_torch_sees_gpu,
          check_amd_arch, check_nvidia_arch)
