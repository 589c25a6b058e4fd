"""`roctune doctor`: simulated machines (built under tmp roots by tests/doctor_machines.py), the CLI,
preflight for `roctune train`, and `--explain` on log excerpts."""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import doctor_machines as dm  # noqa: E402

from roctune import doctor, hardware  # noqa: E402
from roctune.commands import doctor as doctor_cmd  # noqa: E402
from roctune.errors import EnvironmentProblem  # noqa: E402

XTX = ("Radeon RX 7900 XTX", "gfx1100", 24 * dm.GiB)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in hardware.ENV_KEYS + (doctor.TORCH_FACTS_ENV,):
        monkeypatch.delenv(key, raising=False)


def diagnose(root, facts, user="alice", env=None):
    return doctor.diagnose(hardware.gather(str(root), user, facts, env=env or {}))


def cli(argv, capsys, monkeypatch=None, stdin=None) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="roctune")
    doctor_cmd.register(parser.add_subparsers(dest="command"))
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    args = parser.parse_args(["doctor", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


# ------------------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize("value, name", [(110000, "gfx1100"), (100301, "gfx1031"), (80003, "gfx803"),
                                         (90402, "gfx942"), (90010, "gfx90a"), (120001, "gfx1201"), (0, None)])
def test_gfx_name(value, name):
    assert hardware.gfx_name(value) == name


def test_parse_override():
    assert hardware.parse_override("10.3.0") == "gfx1030"
    assert hardware.parse_override("11.0.0") == "gfx1100"
    assert hardware.parse_override("gfx1030") is None and hardware.parse_override(None) is None


@pytest.mark.parametrize("installed, index", [("6.4.1", "rocm6.4"), ("6.2.2", "rocm6.2"), ("6.2.4", "rocm6.2.4"),
                                              ("7.0.2", "rocm7.0"), ("9.9", "rocm" + hardware.ROCM_WHEEL_INDEXES[-1]),
                                              ("5.0", "rocm5.7"), (None, "rocm" + hardware.ROCM_WHEEL_INDEXES[-1])])
def test_rocm_wheel_index(installed, index):
    assert hardware.rocm_wheel_index(installed) == f"https://download.pytorch.org/whl/{index}"


def test_lora_fit_is_rough_but_sane():
    lora24, qlora24 = doctor.lora_fit(24 * dm.GiB)
    assert 6 < lora24 < 10 and 20 < qlora24 < 32
    assert 60 < doctor.lora_fit(192 * dm.GiB)[0] < 80


# ------------------------------------------------------------------------------- simulated machines


def test_cpu_only(tmp_path):
    r = diagnose(dm.cpu_only(tmp_path), dm.cpu_torch())
    assert r.verdict == "warn" and r.exit_code == 0
    cpu = r.get("cpu")
    assert cpu.level == "warn" and "runs on the CPU" in cpu.message and "slower" in cpu.why
    assert r.get("bf16").message == "training uses fp32"
    assert r.get("attention").message == "attention: sdpa"
    assert not r.machine.gpus


def test_nvidia_ready(tmp_path):
    r = diagnose(dm.nvidia(tmp_path), dm.cuda_torch())
    assert r.verdict == "ok"
    assert r.machine.gpus[0].vendor == "nvidia" and r.machine.gpus[0].name == "NVIDIA GeForce RTX 4090"
    assert r.get("nvidia.driver").message == "NVIDIA driver 570.133.07"
    assert "training uses bf16" in r.get("bf16").message
    assert "LoRA in bf16 fits models up to ~8" in r.get("gpu0.vram").message


def test_nvidia_with_cpu_torch(tmp_path):
    r = diagnose(dm.nvidia(tmp_path), dm.cpu_torch())
    f = r.get("torch.build")
    assert r.verdict == "fail" and f.level == "fail"
    assert f.fix == "pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu128"


def test_nvidia_driver_not_loaded(tmp_path):
    r = diagnose(dm.nvidia(tmp_path, driver=None), dm.cuda_torch(cuda_available=False, devices=[]))
    assert r.verdict == "fail" and r.get("nvidia.driver").level == "fail"
    assert "install the NVIDIA driver" in r.get("nvidia.driver").fix


def test_rx7900xtx_ready(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX]), dm.rocm_torch([XTX]))
    assert r.verdict == "ok", [(f.id, f.level) for f in r.findings]
    gpu = r.machine.gpus[0]
    assert (gpu.vendor, gpu.gfx, gpu.vram_bytes) == ("amd", "gfx1100", 24 * dm.GiB)
    assert "RDNA 3" in r.get("gpu0.arch").message
    assert r.get("amd.access").level == "ok"
    assert "training uses bf16" in r.get("bf16").message
    attn = r.get("attention")
    assert attn.message == "attention: sdpa" and "experimental" in attn.why
    assert attn.fix == "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1"
    r2 = diagnose(tmp_path, dm.rocm_torch([XTX]), env={"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"})
    assert r2.get("attention").fix == ""


def test_rx6700xt_needs_override(tmp_path):
    dm.amd(tmp_path, [dm.RX6700XT])
    facts = dm.rocm_torch([("AMD Radeon RX 6700 XT", "gfx1031", 12 * dm.GiB)])
    r = diagnose(tmp_path, facts)
    arch = r.get("gpu0.arch")
    assert r.verdict == "fail" and arch.level == "fail"
    assert "gfx1031" in arch.message and "RDNA 2" in arch.message
    assert arch.fix.startswith("export HSA_OVERRIDE_GFX_VERSION=10.3.0")
    ok = diagnose(tmp_path, facts, env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert ok.verdict == "ok" and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in ok.get("gpu0.arch").message
    wrong = diagnose(tmp_path, facts, env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    warn = wrong.get("gpu0.arch.override")
    assert warn.level == "warn" and "different generation" in warn.message
    assert warn.fix == "export HSA_OVERRIDE_GFX_VERSION=10.3.0"


def test_override_on_a_natively_supported_card_warns(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX]), dm.rocm_torch([XTX]), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert r.verdict == "warn"
    assert r.get("gpu0.arch.override").fix == "unset HSA_OVERRIDE_GFX_VERSION"
    same = diagnose(tmp_path, dm.rocm_torch([XTX]), env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    assert same.verdict == "ok"


def test_rx580_unsupported(tmp_path):
    dm.amd(tmp_path, [dm.RX580])
    r = diagnose(tmp_path, dm.rocm_torch([("Radeon RX 580 Series", "gfx803", 8 * dm.GiB)]))
    arch = r.get("gpu0.arch")
    assert r.verdict == "fail" and arch.level == "fail"
    assert "not supported by the official PyTorch ROCm wheels" in arch.message and "Polaris" in arch.message
    assert "CPU" in arch.why and arch.fix == "roctune train --device cpu ..."
    assert "emulated" in r.get("bf16").why
    # with a CPU torch there is nothing to install: a warning, and no pip line
    r = diagnose(tmp_path, dm.cpu_torch())
    assert r.verdict == "warn"
    assert r.get("torch.build").level == "warn" and "pip" not in r.get("torch.build").fix
    assert "RX 470/480/570/580" in r.get("gpu0.arch").message


def test_mi50_unsupported_on_current_wheels(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.MI50]), dm.rocm_torch([("AMD Instinct MI50", "gfx906", 32 * dm.GiB)]))
    assert r.get("gpu0.arch").level == "fail" and "older wheels" in r.get("gpu0.arch").why


def test_mi300x_pair_with_xgmi(tmp_path):
    dm.amd(tmp_path, [dm.MI300X, dm.MI300X], xgmi=True)
    devs = [("AMD Instinct MI300X", "gfx942", 192 * dm.GiB)] * 2
    r = diagnose(tmp_path, dm.rocm_torch(devs))
    assert r.verdict == "ok", [(f.id, f.level) for f in r.findings]
    assert [g.gfx for g in r.machine.gpus] == ["gfx942", "gfx942"]
    assert "CDNA 3" in r.get("gpu0.arch").message
    assert "AOTriton" in r.get("attention").why and r.get("attention").fix == ""
    assert "~7" in r.get("gpu0.vram").message  # ~70B-class in bf16 LoRA
    multi = r.get("multi_gpu")
    assert multi.level == "ok" and "XGMI" in multi.message
    # torch's own answer wins when it has one
    r = diagnose(tmp_path, dm.rocm_torch(devs, peer=[[True, False], [False, True]]))
    assert r.get("multi_gpu").level == "warn" and "0↔1" in r.get("multi_gpu").message
    # only one GPU visible: no multi-GPU line
    r = diagnose(tmp_path, dm.rocm_torch(devs[:1]), env={"HIP_VISIBLE_DEVICES": "1"})
    assert r.get("multi_gpu") is None


def test_two_gpus_without_peer_links(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX, dm.RX7900XTX])
    r = diagnose(tmp_path, dm.rocm_torch([XTX, XTX]))
    assert r.get("multi_gpu").level == "warn" and "iommu=pt" in r.get("multi_gpu").fix


def test_two_7900xtx_without_iommu_pt(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX, dm.RX7900XTX], cmdline="BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/nvme0n1p2 quiet")
    r = diagnose(tmp_path, dm.rocm_torch([XTX, XTX]))
    iommu = r.get("multi_gpu.iommu")
    assert iommu.level == "warn" and "no iommu=pt" in iommu.message and "RCCL" in iommu.why
    assert "GRUB_CMDLINE_LINUX_DEFAULT" in iommu.fix and "NCCL_P2P_DISABLE=1" in iommu.fix
    dm.amd(tmp_path / "pt", [dm.RX7900XTX, dm.RX7900XTX], cmdline="quiet iommu=pt", xgmi=True)
    r = diagnose(tmp_path / "pt", dm.rocm_torch([XTX, XTX]), env={"NCCL_P2P_DISABLE": "1"})
    assert r.get("multi_gpu.iommu").level == "ok"
    assert r.get("multi_gpu.p2p").level == "warn" and "unset NCCL_P2P_DISABLE" in r.get("multi_gpu.p2p").fix
    # Instinct cards are not consumer Radeons: no IOMMU advice
    dm.amd(tmp_path / "mi", [dm.MI300X, dm.MI300X], cmdline="quiet", xgmi=True)
    assert diagnose(tmp_path / "mi", dm.rocm_torch([("MI300X", "gfx942", dm.GiB)] * 2)).get("multi_gpu.iommu") is None


def test_mixed_architectures_warn_about_rccl(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX, dm.RX6700XT], cmdline="iommu=pt")
    r = diagnose(tmp_path, dm.rocm_torch([XTX, ("RX 6700 XT", "gfx1031", 12 * dm.GiB)]))
    mixed = r.get("multi_gpu.mixed")
    assert mixed.level == "warn" and "gfx1031, gfx1100" in mixed.message and "RCCL" in mixed.why


def test_override_known_to_fail(tmp_path):
    dm.amd(tmp_path, [dm.RX5700XT])
    r = diagnose(tmp_path, dm.rocm_torch([("RX 5700 XT", "gfx1010", 8 * dm.GiB)]),
                 env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    bad = r.get("gpu0.arch.override")
    assert bad.level == "fail" and "known to fail on the gfx1010" in bad.message
    assert bad.fix.startswith("unset HSA_OVERRIDE_GFX_VERSION") and r.verdict == "fail"
    # without a ROCm torch nothing runs on the GPU yet: a warning
    r = diagnose(tmp_path, dm.cpu_torch(), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert r.get("gpu0.arch.override").level == "warn"


def test_wsl2_rocm(tmp_path):
    dm.wsl(tmp_path)
    facts = dm.rocm_torch([XTX])
    r = diagnose(tmp_path, facts)
    assert r.get("wsl").level == "ok" and "ROCm's WSL runtime" in r.get("wsl").message
    assert r.get("cpu") is None  # sysfs shows no GPU under WSL, but torch sees one
    r = diagnose(tmp_path, dm.cpu_torch())
    assert r.get("wsl").level == "warn" and "libhsa-runtime64" in r.get("wsl").fix
    dm.wsl(tmp_path / "bare", rocm_runtime=False)
    r = diagnose(tmp_path / "bare", dm.rocm_torch([XTX]))
    assert r.get("wsl").level == "fail" and "amdgpu-install -y --usecase=wsl,rocm" in r.get("wsl").fix
    dm.wsl(tmp_path / "nv", rocm_runtime=False, rocm=None, cuda=True)
    assert diagnose(tmp_path / "nv", dm.cuda_torch()).get("wsl").level == "ok"
    assert diagnose(dm.cpu_only(tmp_path / "native"), dm.cpu_torch()).get("wsl") is None


def test_cli_install_plan(tmp_path, capsys):
    dm.amd(tmp_path, [dm.RX6700XT], rocm="6.3.2")
    code, out = cli(["--install-plan", "--root", str(tmp_path), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["torch_index_url"].endswith("/rocm6.3")
    assert data["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0" and data["reasons"]["torch"]
    code, out = cli(["--install-plan"], capsys)  # this machine: no GPU
    assert code == 0 and "install plan: cpu" in out


def test_visible_devices_hiding_everything(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX]), dm.rocm_torch([]), env={"HIP_VISIBLE_DEVICES": "-1"})
    assert r.get("visible").level == "fail" and r.get("visible").fix.startswith("unset HIP_VISIBLE_DEVICES")


def test_user_not_in_render(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX], users={"alice": ["video"], "bob": ["render"]})
    r = diagnose(tmp_path, dm.rocm_torch([]))
    f = r.get("amd.access")
    assert r.verdict == "fail" and f.level == "fail"
    assert "/dev/kfd" in f.message and "render" in f.why
    assert f.fix.startswith("sudo usermod -aG render,video alice") and "log out and in" in f.fix
    assert diagnose(tmp_path, dm.rocm_torch([XTX]), user="bob").get("amd.access").level == "ok"


def test_world_accessible_nodes_need_no_group(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX], users={"alice": []}, dev_mode=0o666)
    assert diagnose(tmp_path, dm.rocm_torch([XTX])).get("amd.access").level == "ok"


def test_unknown_user(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX])
    assert diagnose(tmp_path, dm.rocm_torch([XTX]), user="mallory").get("amd.access").level == "warn"


def test_kfd_missing_in_container(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX], kfd=False, container=True), dm.rocm_torch([]))
    f = r.get("amd.kfd")
    assert r.verdict == "fail" and f.level == "fail" and "container" in f.message
    assert "--device /dev/kfd --device /dev/dri" in f.fix


def test_kfd_missing_driver_not_loaded(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX], kfd=False, kfd_sysfs=False), dm.rocm_torch([]))
    f = r.get("amd.kfd")
    assert r.verdict == "fail" and "not loaded" in f.message and f.fix.startswith("sudo modprobe amdgpu")
    assert r.machine.gpus[0].vendor == "amd"  # still found on the PCI bus through drm


def test_amd_gpu_with_cpu_torch(tmp_path):
    r = diagnose(dm.amd(tmp_path, [dm.RX7900XTX]), dm.cpu_torch())
    f = r.get("torch.build")
    assert r.verdict == "fail" and f.level == "fail" and "AMD GPU present" in f.message
    assert f.fix == "pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"
    assert "bf16" in r.get("bf16").why  # what it would train in after the fix
    # ROCm 7.0.2 installed: the matching index
    (tmp_path / "opt/rocm/.info/version").write_text("7.0.2-56\n")
    assert diagnose(tmp_path, dm.cpu_torch()).get("torch.build").fix.endswith("/whl/rocm7.0")


def test_bitsandbytes_and_flash_attn_judged_for_the_backend(tmp_path):
    dm.amd(tmp_path, [dm.RX7900XTX])
    bnb_ok = {"installed": True, "version": "0.49.0", "libs": ["libbitsandbytes_cpu.so", "libbitsandbytes_rocm64.so"]}
    r = diagnose(tmp_path, dm.rocm_torch([XTX], bitsandbytes=bnb_ok))
    assert r.get("qlora").level == "ok" and "ROCm build" in r.get("qlora").message
    bnb_old = {"installed": True, "version": "0.43.0", "libs": ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda121.so"]}
    q = diagnose(tmp_path, dm.rocm_torch([XTX], bitsandbytes=bnb_old)).get("qlora")
    assert q.level == "warn" and "libbitsandbytes_rocm64" in q.message and "LoRA instead" in q.fix
    fa = {"installed": True, "version": "2.7.4", "build": "cuda", "importable": False,
          "error": "ImportError: libcudart.so.12: cannot open shared object file"}
    r = diagnose(tmp_path, dm.rocm_torch([XTX], flash_attn=fa))
    assert r.get("attention").message == "attention: flash_attention_2"  # what train would pick...
    assert r.get("flash_attn").level == "warn" and "--attn sdpa" in r.get("flash_attn").fix  # ...and why not to
    fa_ok = {"installed": True, "version": "2.7.4", "build": "triton-amd", "importable": True}
    r = diagnose(tmp_path, dm.rocm_torch([XTX], flash_attn=fa_ok))
    assert r.get("flash_attn").level == "ok" and "FLASH_ATTENTION_TRITON_AMD_ENABLE" in r.get("flash_attn").fix


def test_this_machine_live():
    r = doctor.diagnose(hardware.gather("/"))
    assert r.verdict in ("ok", "warn")
    if not r.machine.gpus:
        assert r.verdict == "warn" and r.get("cpu").level == "warn"
    assert r.machine.torch["version"]


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_json_simulated_rocm(tmp_path, capsys):
    dm.amd(tmp_path, [dm.RX6700XT])
    facts = json.dumps(dm.rocm_torch([("AMD Radeon RX 6700 XT", "gfx1031", 12 * dm.GiB)]))
    code, out = cli(["--root", str(tmp_path), "--user", "alice", "--torch-facts", facts, "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "fail"
    assert data["torch"]["backend"] == "rocm"
    assert data["gpus"][0]["vendor"] == "amd" and data["gpus"][0]["gfx"] == "gfx1031"
    assert data["gpus"][0]["vram_bytes"] == 12 * dm.GiB and data["gpus"][0]["name"]
    ids = {f["id"]: f for f in data["findings"]}
    assert set(ids["gpu0.arch"]) >= {"id", "level", "message", "fix"}
    assert ids["gpu0.arch"]["fix"].startswith("export HSA_OVERRIDE_GFX_VERSION=10.3.0")


def test_cli_torch_facts_from_env_and_file(tmp_path, capsys, monkeypatch):
    root = dm.amd(tmp_path / "root", [dm.RX7900XTX])
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dm.cpu_torch()))
    monkeypatch.setenv(doctor.TORCH_FACTS_ENV, f"@{facts}")
    code, out = cli(["--root", str(root), "--user", "alice"], capsys)
    assert code == 1
    assert "AMD GPU present" in out and "download.pytorch.org/whl/rocm6.4" in out and "verdict: FAIL" in out


def test_cli_table_on_this_machine(capsys):
    code, out = cli([], capsys)
    assert code == 0 and "verdict:" in out and "Checks" in out


def test_cli_through_main(capsys):
    from roctune.cli import main

    code = main(["doctor", "--json", "--no-tools"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["verdict"] in ("ok", "warn") and "findings" in data


# ------------------------------------------------------------------------------------------ preflight


def test_preflight_on_this_machine_is_fast_and_passes():
    import torch  # noqa: F401  (train has imported it already; preflight's own cost is what counts)

    start = time.perf_counter()
    report = hardware.preflight("auto")
    assert time.perf_counter() - start < 1.0
    assert report.verdict in ("ok", "warn")


def test_preflight_cpu_machine(tmp_path):
    assert hardware.preflight("auto", root=str(dm.cpu_only(tmp_path)), torch_facts=dm.cpu_torch()).verdict == "warn"


def test_preflight_stops_on_amd_gpu_with_cpu_torch(tmp_path):
    root = str(dm.amd(tmp_path, [dm.RX7900XTX]))
    with pytest.raises(EnvironmentProblem) as e:
        hardware.preflight("auto", root=root, torch_facts=dm.cpu_torch())
    assert "--index-url https://download.pytorch.org/whl/rocm6.4" in str(e.value) and "--device cpu" in str(e.value)
    assert e.value.exit_code == 1
    assert hardware.preflight("cpu", root=root, torch_facts=dm.cpu_torch()).verdict == "fail"


def test_preflight_stops_on_unsupported_arch_with_rocm_torch(tmp_path):
    root = str(dm.amd(tmp_path, [dm.RX580]))
    facts = dm.rocm_torch([("Radeon RX 580 Series", "gfx803", 8 * dm.GiB)])
    with pytest.raises(EnvironmentProblem, match="gfx803"):
        hardware.preflight("auto", root=root, torch_facts=facts)
    hardware.preflight("cpu", root=root, torch_facts=facts)


# -------------------------------------------------------------------------------------------- explain

LOGS = {
    "oom": """\
  File "/home/alice/.venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 23.98 GiB of which 1.12 GiB is free. Of the allocated memory 20.41 GiB is allocated by PyTorch, and 1.96 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
""",
    "oom_cuda": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
                "capacity of 11.76 GiB of which 301.44 MiB is free.\n",
    "no_binary": """\
Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.62s/it]
rocBLAS error: Cannot read /opt/rocm/lib/rocblas/library/TensileLibrary.dat: Illegal seek for GPU arch : gfx1031
 List of available TensileLibrary Files :
"/opt/rocm/lib/rocblas/library/TensileLibrary_lazy_gfx1030.dat"
HIP error: invalid device function
HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
""",
    "no_binary_2": "\"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!\"\n"
                   "Aborted (core dumped)\n",
    "kernel": """\
  File "/home/alice/.venv/lib/python3.12/site-packages/flash_attn/flash_attn_interface.py", line 91, in _flash_attn_forward
    out, softmax_lse, S_dmask, rng_state = flash_attn_gpu.fwd(
RuntimeError: HIP error: the operation cannot be performed in the present state
""",
    "kernel_ck": "RuntimeError: Kernel not supported for the given arguments (head_dim=256)\n",
    "bitsandbytes": """\
Could not find the bitsandbytes ROCm binary at PosixPath('/home/alice/.venv/lib/python3.12/site-packages/bitsandbytes/libbitsandbytes_rocm62.so')
The installed version of bitsandbytes was compiled without GPU support. 8-bit optimizers and GPU quantization are unavailable.
""",
    "trust_remote_code": "ValueError: The repository for microsoft/phi-1_5 contains custom code which must be "
                         "executed to correctly load the model. You can inspect the repository content at "
                         "https://hf.co/microsoft/phi-1_5.\nPlease pass the argument `trust_remote_code=True` "
                         "to allow custom code to be run.\n",
    "no_gpu": ">>> import torch; torch.cuda.is_available()\nFalse\n"
              "roctune train: error: --device cuda: torch.cuda.is_available() is False\n",
    "no_gpu_2": "RuntimeError: No HIP GPUs are available\nhipErrorNoDevice\n",
    "collective": """\
[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
""",
}
EXPECTED = {"oom": "oom", "oom_cuda": "oom", "no_binary": "no_binary", "no_binary_2": "no_binary", "kernel": "kernel",
            "kernel_ck": "kernel", "bitsandbytes": "bitsandbytes", "trust_remote_code": "trust_remote_code",
            "no_gpu": "no_gpu", "no_gpu_2": "no_gpu", "collective": "collective"}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_explain_recognises(name):
    ids = [e.id for e in doctor.explain(LOGS[name])]
    assert EXPECTED[name] in ids, ids


def test_explain_details():
    oom = doctor.explain(LOGS["oom"])[0]
    assert "1.95 GiB" in oom.cause and "23.98 GiB" in oom.cause
    assert any("--batch-size 1" in f for f in oom.fix) and any("--grad-checkpointing" in f for f in oom.fix)
    assert any("QLoRA" in f for f in oom.fix) and any("--max-length" in f for f in oom.fix)
    nobin = next(e for e in doctor.explain(LOGS["no_binary"]) if e.id == "no_binary")
    assert any("gfx1031" in f and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in f for f in nobin.fix)
    assert nobin.line == 2 and "TensileLibrary" in nobin.evidence  # the first symptom in the log
    kernel = next(e for e in doctor.explain(LOGS["kernel"]) if e.id == "kernel")
    assert "--attn sdpa" in kernel.fix[0]
    assert any("LoRA instead" in f for f in doctor.explain(LOGS["bitsandbytes"])[0].fix)
    assert any("--trust-remote-code" in f for f in doctor.explain(LOGS["trust_remote_code"])[0].fix)


def test_explain_unknown_log_matches_nothing(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("step 10 loss 1.234\nstep 20 loss 1.101\nTraceback (most recent call last):\nKeyError: 'text'\n")
    assert doctor.explain(log.read_text()) == []
    code, out = cli(["--explain", str(log)], capsys)
    assert code == 0 and "Nothing in" in out and "matched" in out


def test_explain_cli_stdin(capsys, monkeypatch):
    code, out = cli(["--explain", "-"], capsys, monkeypatch, stdin=LOGS["oom"])
    assert code == 0 and "GPU out of memory" in out and "fix:" in out
    code, out = cli(["--explain", "-", "--json"], capsys, monkeypatch, stdin=LOGS["collective"])
    assert json.loads(out)["matches"][0]["id"] == "collective"
