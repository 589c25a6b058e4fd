"""`roctune doctor`'s findings in Chinese, for the web UI's Chinese page: English template -> Chinese template.

The checks (roctune/hardware/readiness.py, roctune/hardware/choices.py, roctune/doctor/checks_*.py) write each
message, reason and fix as a `Text` (roctune/hardware/text.py): the English sentence the CLI prints, which keeps
its template and values. The page says it with `say(text, ZH)`; values stay as they are (names, versions, paths,
commands). tests/test_doctor_zh.py checks that every template the checks can write is here, and nothing else."""
from __future__ import annotations

ZH: dict[str, str] = {
    # separators of joined lists
    ", ": "、", " or ": " 或 ", " and ": " 和 ", "; ": "；",
    # the torch build (readiness.check_torch_build)
    "torch {version} ({build} build)": "torch {version}（{build} 版）",
    "CPU-only": "仅 CPU",
    "torch is not installed": "没有安装 torch",
    "PyTorch reaches AMD GPUs only through its ROCm build; the wheel index is matched to the installed ROCm {rocm}":
        "PyTorch 只能通过其 ROCm 版使用 AMD GPU；预编译包的索引按已安装的 ROCm {rocm} 选择",
    "PyTorch reaches AMD GPUs only through its ROCm build (the wheels bundle the ROCm runtime, so a system ROCm "
    "install is optional)": "PyTorch 只能通过其 ROCm 版使用 AMD GPU（预编译包自带 ROCm 运行时，系统里可以不装 ROCm）",
    "AMD GPU present but {torch} cannot use it": "有 AMD GPU，但 {torch} 用不了它",
    "{torch}; the AMD GPU here is not supported by PyTorch ROCm, so training runs on the CPU":
        "{torch}；这里的 AMD GPU 不受 PyTorch ROCm 支持，所以训练在 CPU 上进行",
    "nothing to install: use --device cpu (see the architecture line)": "无需安装：用 --device cpu（见架构那一行）",
    "PyTorch reaches NVIDIA GPUs only through its CUDA build; index chosen for driver {driver}":
        "PyTorch 只能通过其 CUDA 版使用 NVIDIA GPU；索引按驱动 {driver} 选择",
    "PyTorch reaches NVIDIA GPUs only through its CUDA build": "PyTorch 只能通过其 CUDA 版使用 NVIDIA GPU",
    "NVIDIA GPU present but {torch} cannot use it": "有 NVIDIA GPU，但 {torch} 用不了它",
    "no GPU found on this machine; it will run on the CPU": "这台机器上没有找到 GPU；将在 CPU 上运行",
    "matches the hardware": "与硬件相符", "no GPU on this machine": "这台机器没有 GPU",
    # AMD device nodes and access (readiness.check_amd_driver)
    "no /dev/dri/renderD* node": "没有 /dev/dri/renderD* 设备节点",
    "HIP opens the GPU's render node as well as /dev/kfd": "HIP 除了 /dev/kfd 还要打开 GPU 的渲染节点",
    "in a container: docker run {flags}; on the host: sudo udevadm trigger or reboot":
        "在容器中：`docker run {flags}`；在主机上：`sudo udevadm trigger` 或重启",
    "ROCm {version} installed": "已安装 ROCm {version}",
    "PyTorch wheels bundle their own ROCm runtime; the system one matters for tools and for building extensions":
        "PyTorch 的预编译包自带 ROCm 运行时；系统里的 ROCm 用于工具和编译扩展",
    "/dev/kfd is missing in this container": "这个容器里没有 /dev/kfd",
    "the container was started without the GPU device nodes": "容器启动时没有挂载 GPU 设备节点",
    "restart the container with: docker run {flags} ... (podman: the same --device flags)":
        "用 `docker run {flags} ...` 重新启动容器（`podman`：同样的 `--device` 参数）",
    "/dev/kfd is missing: the amdgpu compute driver (KFD) is not loaded": "没有 /dev/kfd：`amdgpu` 计算驱动（KFD）没有加载",
    "an AMD GPU is on the PCI bus but /sys/class/kfd does not exist": "PCI 总线上有 AMD GPU，但 /sys/class/kfd 不存在",
    "sudo modprobe amdgpu; if that fails install the driver (`sudo amdgpu-install --usecase=dkms`) and reboot; "
    "`sudo dmesg | grep -i amdgpu` shows why it did not load":
        "`sudo modprobe amdgpu`；如果失败，安装驱动（`sudo amdgpu-install --usecase=dkms`）并重启；"
        "`sudo dmesg | grep -i amdgpu` 会显示没有加载的原因",
    "/dev/kfd is missing although the amdgpu driver is loaded": "`amdgpu` 驱动已加载，但没有 /dev/kfd",
    "udev did not create the device node": "`udev` 没有创建设备节点",
    "sudo udevadm trigger (or reboot); in a container: docker run {flags}":
        "`sudo udevadm trigger`（或重启）；在容器中：`docker run {flags}`",
    "user {user} is not in {root}/etc/passwd or /etc/group": "用户 {user} 不在 {root}/etc/passwd 或 /etc/group 中",
    "group membership cannot be judged": "无法判断所属的组", "check the name given with --user": "检查 `--user` 给出的用户名",
    "{path} (group {group}, mode {mode})": "{path}（组 {group}，权限 {mode}）",
    "{user} was added to {groups} but this session predates it": "{user} 已加入 {groups}，但当前会话是在那之前登录的",
    "cannot open {nodes}; group changes apply to new logins only": "无法打开 {nodes}；组的变更只对新登录生效",
    "log out and in (or reboot); for this shell only: newgrp render": "注销后重新登录（或重启）；只对当前终端：`newgrp render`",
    "sudo usermod -aG render,video {user}, then log out and in": "`sudo usermod -aG render,video {user}`，然后注销并重新登录",
    "{fix} (in a container: docker run ... --group-add render --group-add video)":
        "{fix}（在容器中：`docker run ... --group-add render --group-add video`）",
    "user {user} cannot open {nodes}": "用户 {user} 无法打开 {nodes}",
    "{user} is in groups [{groups}], not in {need}": "{user} 属于组 [{groups}]，不属于 {need}",
    "none": "无",
    "{user} can open {nodes}": "{user} 可以打开 {nodes}",
    "world-accessible": "所有用户都可访问", "member of {groups}": "属于 {groups} 组", "the owning group": "设备所属的组",
    # NVIDIA driver, visibility, torch and the GPU
    "restart the container with --gpus all (NVIDIA Container Toolkit)":
        "用 `--gpus all` 重新启动容器（需要 `NVIDIA Container Toolkit`）",
    "install the NVIDIA driver (e.g. `sudo ubuntu-drivers install`), reboot, then check `nvidia-smi`":
        "安装 NVIDIA 驱动（例如 `sudo ubuntu-drivers install`），重启，然后检查 `nvidia-smi`",
    "NVIDIA GPU present but the NVIDIA driver is not loaded": "有 NVIDIA GPU，但 NVIDIA 驱动没有加载",
    "/proc/driver/nvidia/version does not exist": "/proc/driver/nvidia/version 不存在",
    "NVIDIA driver {version}": "NVIDIA 驱动 {version}",
    "{name}={value} hides every GPU": "{name}={value} 隐藏了所有 GPU",
    "the runtime only shows the GPUs listed there": "运行时只显示那里列出的 GPU",
    "unset {name}  (or list GPUs: {name}=0)": "`unset {name}`（或只列出要用的 GPU：`{name}=0`）",
    "{torch} sees no GPU (torch.cuda.is_available() is False)":
        "{torch} 看不到 GPU（`torch.cuda.is_available()` 为 `False`）",
    "driver, device permissions or visibility env vars": "驱动、设备权限或控制可见性的环境变量",
    "run `roctune doctor --json` on the host and compare; check `rocminfo`/`nvidia-smi` works for this user":
        "在主机上运行 `roctune doctor --json` 并对比；检查这个用户能否运行 `rocminfo`/`nvidia-smi`",
    "torch sees {n} GPUs": "torch 看到 {n} 个 GPU", "torch sees 1 GPU": "torch 看到 1 个 GPU",
    # AMD architectures and HSA_OVERRIDE_GFX_VERSION
    "unset HSA_OVERRIDE_GFX_VERSION": "取消这个变量：`unset HSA_OVERRIDE_GFX_VERSION`",
    "HSA_OVERRIDE_GFX_VERSION={override} is known to fail on the {gfx} ({family})":
        "已知 `HSA_OVERRIDE_GFX_VERSION={override}` 在 {gfx}（{family}）上会出错",
    "the {kernels} kernels use instructions the {gfx} lacks: crashes (illegal instruction, memory access fault) or "
    "silently wrong numbers": "{kernels} 的内核使用了 {gfx} 没有的指令：会崩溃（非法指令、内存访问错误）或悄悄算出错误的数",
    "unset HSA_OVERRIDE_GFX_VERSION; train with --device cpu": "`unset HSA_OVERRIDE_GFX_VERSION`；用 `--device cpu` 训练",
    "HSA_OVERRIDE_GFX_VERSION={override} is not a version like 10.3.0":
        "`HSA_OVERRIDE_GFX_VERSION={override}` 不是 10.3.0 这样的版本号",
    "the ROCm runtime ignores or misreads it": "ROCm 运行时会忽略或误读它",
    "HSA_OVERRIDE_GFX_VERSION={override} makes the {gfx} pose as {other}, a different generation":
        "`HSA_OVERRIDE_GFX_VERSION={override}` 让 {gfx} 冒充另一代的 {other}",
    "kernels built for another generation crash or compute garbage": "为另一代编译的内核会崩溃或算出乱码",
    "HSA_OVERRIDE_GFX_VERSION={override} is set but {gfx} is supported natively":
        "设置了 `HSA_OVERRIDE_GFX_VERSION={override}`，但 {gfx} 本身就受支持",
    "the override makes ROCm load kernels for another chip": "这个覆盖让 ROCm 加载另一种芯片的内核",
    "HSA_OVERRIDE_GFX_VERSION={override} is not the value for {gfx}":
        "`HSA_OVERRIDE_GFX_VERSION={override}` 不是 {gfx} 该用的值",
    "{gfx} runs with the {kernels} kernels": "{gfx} 使用 {kernels} 的内核运行",
    "this torch build has kernels for it": "这个 torch 版本有它的内核",
    "supported by the official PyTorch ROCm wheels": "官方 PyTorch ROCm 预编译包支持它",
    "{gpu}: {where}": "{gpu}：{where}",
    "{gpu}: runs through HSA_OVERRIDE_GFX_VERSION={value}": "{gpu}：通过 `HSA_OVERRIDE_GFX_VERSION={value}` 运行",
    "not in the official wheels; the {kernels} kernels work on it": "官方预编译包中没有它；{kernels} 的内核可以在它上面运行",
    "{gpu}: needs HSA_OVERRIDE_GFX_VERSION={value}": "{gpu}：需要 `HSA_OVERRIDE_GFX_VERSION={value}`",
    "the official PyTorch ROCm wheels have no {gfx} kernels; it runs the {kernels} ones (without the override: "
    "hipErrorNoBinaryForGpu)": "官方 PyTorch ROCm 预编译包没有 {gfx} 的内核；它运行 {kernels} 的内核（不设置覆盖会报 "
    "`hipErrorNoBinaryForGpu`）",
    "export HSA_OVERRIDE_GFX_VERSION={value}  (add it to ~/.bashrc)":
        "`export HSA_OVERRIDE_GFX_VERSION={value}`（加到 `~/.bashrc` 中）",
    "{gpu}: not supported by the official PyTorch ROCm wheels": "{gpu}：官方 PyTorch ROCm 预编译包不支持它",
    "{note}; no override makes current wheels run on it. What remains: training on the CPU, or an old ROCm/PyTorch "
    "combination built for it (unsupported)":
        "{note}；任何覆盖都不能让当前的预编译包在它上面运行。剩下的办法：在 CPU 上训练，或者使用为它编译的旧版 "
        "ROCm/PyTorch 组合（不受支持）",
    "{gpu}: this torch build has no kernels for {gfx}": "{gpu}：这个 torch 版本没有 {gfx} 的内核",
    "its arch list is {archs}; {note}": "它支持的架构是 {archs}；{note}", "its arch list is {archs}": "它支持的架构是 {archs}",
    "{gpu}: an architecture roctune does not know": "{gpu}：roctune 不认识的架构",
    "whether PyTorch ROCm supports it is not known here": "这里不知道 PyTorch ROCm 是否支持它",
    "check `rocminfo` and the ROCm support matrix": "查看 `rocminfo` 和 ROCm 的支持矩阵",
    "GPU {i}: {name} (compute capability {cc})": "GPU {i}：{name}（计算能力 {cc}）",
    "current CUDA wheels need 7.0 or newer": "当前的 CUDA 预编译包需要 7.0 或更高",
    # the architecture table's notes (roctune/hardware/gpus.py)
    "deprecated by AMD and absent from current PyTorch ROCm wheels; older wheels (ROCm 5.7 / 6.0 era) still run on "
    "it": "AMD 已弃用，当前的 PyTorch ROCm 预编译包不再包含它；旧版预编译包（ROCm 5.7 / 6.0 时期）仍能在它上面运行",
    "dropped from ROCm years ago; only community builds of old ROCm/PyTorch exist":
        "多年前已从 ROCm 中移除；只有社区编译的旧版 ROCm/PyTorch",
    "needs a recent wheel (ROCm 6.4 or newer)": "需要较新的预编译包（ROCm 6.4 或更高）",
    "needs a wheel for ROCm 6.4 or newer": "需要 ROCm 6.4 或更高版本的预编译包",
    "no longer in the PyTorch ROCm wheels; the last ones with it are for ROCm 5.x":
        "PyTorch ROCm 预编译包已不再包含它；最后包含它的是 ROCm 5.x 的版本",
    # no GPU
    "no GPU: training runs on the CPU": "没有 GPU：训练在 CPU 上进行",
    "a CPU trains roughly 10-50x slower than a mid-range GPU: fine for models up to ~0.5B parameters and small data "
    "sets (the bundled 135M demo takes minutes), impractical beyond ~1B":
        "CPU 训练大约比中端 GPU 慢 10-50 倍：适合约 0.5B 参数以内的模型和小数据集（自带的 135M 演示只需几分钟），"
        "超过约 1B 就不现实了",
    "use a machine with an AMD (ROCm) or NVIDIA GPU for larger models; on the CPU keep models small":
        "更大的模型请用有 AMD（ROCm）或 NVIDIA GPU 的机器；在 CPU 上请用小模型",
    # device, dtype and attention (hardware/choices.py, doctor/checks_torch.py)
    "asked for with --device cpu": "用 `--device cpu` 指定",
    "no GPU visible to torch (run `roctune doctor` if you expected one)":
        "torch 看不到 GPU（如果应该有，请运行 `roctune doctor`）",
    "asked for; note: on most CPUs half-precision matmul is far slower than fp32":
        "按指定；注意：在大多数 CPU 上半精度矩阵乘法比 fp32 慢得多",
    "asked for with --dtype": "用 `--dtype` 指定", "asked for with --attn": "用 `--attn` 指定",
    "CPU: fp32 matmul is far faster than bf16 here": "CPU：这里 fp32 矩阵乘法比 bf16 快得多",
    "GPU supports bf16": "GPU 支持 bf16", "GPU has no bf16 support": "GPU 不支持 bf16",
    "flash-attn is installed and the GPU runs in half precision": "已安装 `flash-attn`，且 GPU 以半精度运行",
    "PyTorch scaled_dot_product_attention (fastest kernel on the CPU)":
        "PyTorch 的 `scaled_dot_product_attention`（CPU 上最快的实现）",
    "PyTorch scaled_dot_product_attention; flash-attn is not installed":
        "PyTorch 的 `scaled_dot_product_attention`；没有安装 `flash-attn`",
    "bf16 supported: training uses {dtype}": "支持 bf16：训练使用 {dtype}",
    "bf16 not supported: training uses {dtype}": "不支持 bf16：训练使用 {dtype}",
    "{reason}; but {gfx} has no bf16 hardware, so it is emulated and slow: --dtype fp16 is faster":
        "{reason}；但 {gfx} 没有 bf16 硬件，只能模拟，很慢：`--dtype fp16` 更快",
    "training uses {dtype} on the CPU for now": "目前训练在 CPU 上使用 {dtype}",
    "{reason}; with ROCm torch this GPU would train in {future}": "{reason}；装上 ROCm 版 torch 后这块 GPU 会用 {future} 训练",
    "training uses {dtype}": "训练使用 {dtype}",
    "attention: {kernel}": "注意力实现：{kernel}",
    "{reason}; its flash and memory-efficient kernels (AOTriton) support {gfx}":
        "{reason}；它的 FlashAttention 与省内存注意力内核（`AOTriton`）支持 {gfx}",
    "{reason}; experimental flash kernels for {gfx} enabled": "{reason}；已启用 {gfx} 的实验性 FlashAttention 内核",
    "{reason}; its flash path for {gfx} is experimental and off, so it falls back to slower kernels":
        "{reason}；它对 {gfx} 的 FlashAttention 路径是实验性的且未开启，所以退回到较慢的内核",
    "{reason}; no flash kernels for {gfx}: it uses the math kernel (more memory at long lengths)":
        "{reason}；没有 {gfx} 的 FlashAttention 内核：使用 `math` 内核（长序列时占用更多内存）",
    # flash-attn, bitsandbytes, packages (doctor/checks_libs.py)
    "it fails to import ({error})": "无法导入（{error}）",
    "it is built for {build} but torch is {backend}": "它是为 {build} 编译的，但 torch 是 {backend} 版",
    "flash-attn has no kernels for {gfx}": "`flash-attn` 没有 {gfx} 的内核",
    "flash-attn 2 needs compute capability 8.0 (Ampere) or newer": "`flash-attn` 2 需要计算能力 8.0（Ampere）或更高",
    "{lib} installed but unusable: {problems}": "已安装 {lib}，但无法使用：{problems}",
    "auto attention picks flash_attention_2 whenever flash-attn is installed":
        "只要安装了 `flash-attn`，auto 注意力就会选择 `flash_attention_2`",
    "pass --attn sdpa, or pip uninstall -y flash-attn": "加上 `--attn sdpa`，或 `pip uninstall -y flash-attn`",
    "{lib} installed (not used on the CPU)": "已安装 {lib}（CPU 上不使用）",
    "{lib} installed and supports this GPU": "已安装 {lib}，支持这块 GPU",
    "export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE  (flash-attn's Triton backend is the one for RDNA)":
        "`export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE`（RDNA 要用 `flash-attn` 的 Triton 后端）",
    "{pip} (ships ROCm builds); or use LoRA instead": "{pip}（带有 ROCm 版本）；或者改用 LoRA",
    "{pip}; or use LoRA instead": "{pip}；或者改用 LoRA",
    "QLoRA unavailable: bitsandbytes is not installed (LoRA works)": "QLoRA 不可用：没有安装 bitsandbytes（LoRA 可用）",
    "QLoRA loads the base model in 4-bit through bitsandbytes": "QLoRA 通过 bitsandbytes 以 4 位加载基础模型",
    "{pip}  (or: pip install -e '.[qlora]'); or use LoRA instead": "{pip}（或：`pip install -e '.[qlora]'`）；或者改用 LoRA",
    "{lib}: has a {backend} build matching torch": "{lib}：有与 torch 匹配的 {backend} 版本",
    "{lib}: no libbitsandbytes_{want}{pattern} for this {backend} torch":
        "{lib}：没有适合这个 {backend} 版 torch 的 `libbitsandbytes_{want}{pattern}`",
    "libraries: {libs}": "库文件：{libs}",
    "{lib} installed; QLoRA needs a GPU, on the CPU use LoRA": "已安装 {lib}；QLoRA 需要 GPU，在 CPU 上请用 LoRA",
    "4-bit kernels on the CPU are slower than fp32 LoRA": "CPU 上的 4 位内核比 fp32 的 LoRA 还慢",
    "missing: {names}": "缺少：{names}", "roctune needs them for training": "roctune 训练需要它们",
    "{packages}": "已安装：{packages}",
    # memory and several GPUs (doctor/checks_gpu.py)
    "GPU {i}: {vram} VRAM, {free} free: LoRA in bf16 fits models up to {lora} parameters, QLoRA up to {qlora}":
        "GPU {i}：显存 {vram}，空闲 {free}：bf16 的 LoRA 可训练最多 {lora} 参数的模型，QLoRA 最多 {qlora}",
    "rough: about 2.4 bytes per parameter for bf16 LoRA and 0.75 for QLoRA at short lengths and small batches "
    "(`roctune estimate` is the precise tool)":
        "粗略估计：短序列、小批量时 bf16 的 LoRA 每个参数约 2.4 字节，QLoRA 约 0.75 字节（精确估计请用 `roctune estimate`）",
    "use a smaller model or QLoRA": "换一个更小的模型，或者用 QLoRA",
    "the KFD topology": "KFD 拓扑", "unknown without torch": "没有 torch 无法得知",
    "{n} GPUs visible, all with direct peer access{kinds}": "可见 {n} 个 GPU，彼此都能直接点对点访问{kinds}",
    "{names}; from {how}": "{names}；来自 {how}",
    "NCCL_P2P_DISABLE={value} although the GPUs have direct peer access":
        "GPU 之间可以直接点对点访问，却设置了 `NCCL_P2P_DISABLE={value}`",
    "RCCL/NCCL then copy through host memory: slower gradient exchange": "RCCL/NCCL 于是经主机内存复制：梯度交换更慢",
    "unset NCCL_P2P_DISABLE (keep it only if RCCL hangs without it)": "`unset NCCL_P2P_DISABLE`（只有不设它 RCCL 会卡住时才保留）",
    "{n} GPUs visible; no direct peer access between {pairs}": "可见 {n} 个 GPU；{pairs} 之间不能直接点对点访问",
    "{names}; from {how}. Multi-GPU training still works, but tensors travel through host memory":
        "{names}；来自 {how}。多 GPU 训练仍然可行，但张量要经过主机内存传输",
    "check the IOMMU (kernel parameter iommu=pt) and BIOS settings (Above 4G decoding, Resizable BAR); if RCCL/NCCL "
    "hangs: export NCCL_P2P_DISABLE=1; or train on one GPU: {one}":
        "检查 IOMMU（内核参数 `iommu=pt`）和 BIOS 设置（`Above 4G decoding`、`Resizable BAR`）；如果 RCCL/NCCL 卡住："
        "`export NCCL_P2P_DISABLE=1`；或者只用一块 GPU 训练：`{one}`",
    "mixed architectures: {archs}": "混用了不同架构：{archs}",
    "one process runs one set of kernels (and one HSA_OVERRIDE_GFX_VERSION) for all GPUs, and RCCL collectives "
    "between different architectures are slow or unsupported":
        "一个进程对所有 GPU 只用一套内核（和一个 `HSA_OVERRIDE_GFX_VERSION`），不同架构之间的 RCCL 集合通信很慢或不受支持",
    "pick GPUs of one kind: HIP_VISIBLE_DEVICES=<indices>": "选用同一种 GPU：`HIP_VISIBLE_DEVICES=<编号>`",
    "{n} Radeon GPUs and the IOMMU in passthrough (iommu=pt)": "{n} 块 Radeon GPU，IOMMU 处于直通模式（`iommu=pt`）",
    "{n} Radeon GPUs but the kernel command line has no iommu=pt": "{n} 块 Radeon GPU，但内核命令行中没有 `iommu=pt`",
    "with the IOMMU translating, peer-to-peer transfers between consumer Radeon cards hang or fail in RCCL "
    "(multi-GPU training stalls at the first all-reduce)":
        "IOMMU 做地址转换时，消费级 Radeon 卡之间的点对点传输在 RCCL 中会卡住或失败（多 GPU 训练停在第一次 `all-reduce`）",
    "add iommu=pt to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, sudo update-grub, reboot; until then: export "
    "NCCL_P2P_DISABLE=1": "在 /etc/default/grub 的 `GRUB_CMDLINE_LINUX_DEFAULT` 中加上 `iommu=pt`，`sudo update-grub`，重启；"
    "在那之前：`export NCCL_P2P_DISABLE=1`",
    # WSL (doctor/checks_wsl.py)
    "{wsl} without /dev/dxg: no GPU reaches this Linux": "{wsl} 没有 /dev/dxg：这个 Linux 用不到任何 GPU",
    "WSL2 passes GPUs through /dev/dxg, which appears with a current Windows GPU driver":
        "WSL2 通过 /dev/dxg 传递 GPU，装了较新的 Windows GPU 驱动才会出现",
    "update Windows and its GPU driver (AMD Adrenalin for WSL / NVIDIA), then `wsl --update`":
        "更新 Windows 及其 GPU 驱动（`AMD Adrenalin for WSL` / NVIDIA），然后运行 `wsl --update`",
    "{wsl} with the Windows NVIDIA driver (libcuda mapped into WSL)": "{wsl} 使用 Windows 的 NVIDIA 驱动（`libcuda` 映射进 WSL）",
    "do not install a Linux NVIDIA driver inside WSL": "不要在 WSL 里安装 Linux 版 NVIDIA 驱动",
    "{wsl} with ROCm's WSL runtime": "{wsl} 带有 ROCm 的 WSL 运行时",
    "torch must be AMD's build for WSL, using the WSL runtime (not the one bundled in torch)":
        "torch 必须是 AMD 为 WSL 编译的版本，使用 WSL 运行时（而不是 torch 自带的）",
    "{wsl}: /dev/dxg is there but not ROCm's WSL runtime (or the NVIDIA library)":
        "{wsl}：有 /dev/dxg，但没有 ROCm 的 WSL 运行时（也没有 NVIDIA 的库）",
    "an AMD GPU under WSL needs ROCm's WSL runtime (hsa-runtime-rocr4wsl-amdgpu) and AMD's torch wheels for WSL":
        "WSL 下的 AMD GPU 需要 ROCm 的 WSL 运行时（`hsa-runtime-rocr4wsl-amdgpu`）和 AMD 为 WSL 提供的 torch 预编译包",
}
