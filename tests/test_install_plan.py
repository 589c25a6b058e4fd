"""The install planner on simulated machines (sysfs trees and version files under a tmp root): the torch wheel
index, bitsandbytes build and attention choice with reasons, and that it runs on a bare python3 (no torch)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import doctor_machines as dm  # noqa: E402

from roctune.hardware.install_plan import format_text, main, plan  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WHL = "https://download.pytorch.org/whl/"


@pytest.mark.parametrize("rocm, index", [("6.2.2-116", "rocm6.2"), ("6.3.3", "rocm6.3"), ("6.4.1-120", "rocm6.4")])
def test_rocm_machines_get_the_index_of_their_rocm(tmp_path, rocm, index):
    p = plan(str(dm.amd(tmp_path, [dm.RX7900XTX], rocm=rocm)))
    assert p.platform == "rocm" and p.torch_index_url == WHL + index
    assert f"installed ROCm {rocm.split('-')[0]}" in p.reasons["torch"]
    assert p.attention == "flash_attn_triton" and p.env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" in p.env and "RDNA" in p.reasons["attention"]
    if index == "rocm6.4":
        assert p.bitsandbytes.startswith("pip install") and "ROCm 6.4" in p.reasons["bitsandbytes"]
    else:
        assert "-DCOMPUTE_BACKEND=hip" in p.bitsandbytes and "gfx1100" in p.bitsandbytes
        assert "source build" in p.reasons["bitsandbytes"]


def test_mi300x_gets_the_ck_flash_attention(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.MI300X, dm.MI300X], xgmi=True)))
    assert p.attention == "flash_attn_ck" and "GPU_ARCHS=gfx942" in " ".join(p.steps)
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" not in p.env and not p.warnings


def test_override_card_gets_the_override(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.RX6700XT])))
    assert p.env == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"} and "gfx1031" in p.reasons["env"]
    assert p.attention == "sdpa"


def test_rdna4_raises_an_old_rocm_to_the_index_that_has_its_kernels(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.RX9070XT], rocm="6.2.4")))
    assert p.torch_index_url == WHL + "rocm6.4" and "raised to ROCm 6.4" in p.reasons["torch"]


def test_amd_without_rocm_installed_gets_the_newest_index(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.RX7900XTX], rocm=None)))
    assert p.torch_index_url.startswith(WHL + "rocm") and "bundle the ROCm" in p.reasons["torch"]


def test_nvidia_driver_picks_the_cuda_index(tmp_path):
    p = plan(str(dm.nvidia(tmp_path, driver="570.133.07")))
    assert p.platform == "cuda" and p.torch_index_url == WHL + "cu128"
    assert "570.133.07" in p.reasons["torch"] and p.attention == "sdpa"
    old = plan(str(dm.nvidia(tmp_path / "old", driver="535.183.01")))
    assert old.torch_index_url == WHL + "cu126"
    none = plan(str(dm.nvidia(tmp_path / "none", driver=None)))
    assert none.warnings and "install the NVIDIA driver" in none.steps[0]


def test_cpu_only_installs_torch_from_pypi(tmp_path):
    p = plan(str(dm.cpu_only(tmp_path)))
    assert p.platform == "cpu" and p.torch_index_url is None and not p.manual
    assert "no AMD or NVIDIA GPU" in p.reasons["platform"] and p.attention == "sdpa"


def test_unsupported_card_is_explained_and_gets_the_cpu_build(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.RX580])))
    assert p.platform == "cpu" and p.torch_index_url is None
    why = p.reasons["platform"]
    assert "gfx803" in why and "Polaris" in why and "dropped from ROCm" in why and "CPU" in why
    rdna1 = plan(str(dm.amd(tmp_path / "rdna1", [dm.RX5700XT])))
    assert rdna1.platform == "cpu" and "HSA_OVERRIDE_GFX_VERSION=10.3.0 is known to fail" in rdna1.warnings[0]


def test_wsl2_with_rocm_runtime_needs_manual_steps(tmp_path):
    p = plan(str(dm.wsl(tmp_path, rocm="6.4.1")))
    assert p.platform == "wsl-rocm" and p.manual and p.torch_index_url is None
    assert p.torch_find_links == "https://repo.radeon.com/rocm/manylinux/rocm-rel-6.4.1/"
    assert "WSL2" in p.reasons["platform"] and any("libhsa-runtime64" in s for s in p.steps)
    assert not any("amdgpu-install" in s for s in p.steps)
    bare = plan(str(dm.wsl(tmp_path / "bare", rocm_runtime=False, rocm="6.4.0")))
    assert bare.torch_find_links.endswith("rocm-rel-6.4/") and "amdgpu-install" in bare.steps[0]
    nothing = plan(str(dm.wsl(tmp_path / "nothing", rocm_runtime=False, rocm=None)))
    assert nothing.platform == "cpu" and "/dev/dxg" in nothing.reasons["platform"]


def test_wsl2_nvidia_uses_the_cuda_index(tmp_path):
    p = plan(str(dm.wsl(tmp_path, rocm_runtime=False, rocm=None, cuda=True)))
    assert p.platform == "wsl-cuda" and p.torch_index_url.startswith(WHL + "cu") and not p.manual


def test_two_7900xtx_plan(tmp_path):
    p = plan(str(dm.amd(tmp_path, [dm.RX7900XTX, dm.RX7900XTX], cmdline="BOOT_IMAGE=/vmlinuz quiet")))
    assert p.platform == "rocm" and len(p.gpus) == 2 and not p.warnings


def test_cli_json_and_index_url(tmp_path, capsys):
    root = str(dm.amd(tmp_path, [dm.MI300X], rocm="6.3.1"))
    assert main(["--json", "--root", root]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["torch_index_url"] == WHL + "rocm6.3" and set(out["reasons"]) >= {"platform", "torch", "attention"}
    assert main(["--index-url", "--root", root]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == WHL + "rocm6.3" and "install plan: rocm" in captured.err
    assert main(["--index-url", "--root", str(dm.wsl(tmp_path / "wsl"))]) == 3
    assert "torch:" in format_text(plan(root))


def test_runs_on_a_bare_python_without_third_party_packages(tmp_path):
    """`make setup` runs it with python3 before torch exists: importing it must pull in the standard library only."""
    code = ("import sys; before = set(sys.modules); import roctune.hardware.install_plan; "
            "extra = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'roctune'}; "
            "print(sorted(extra))")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    cpu = subprocess.run([sys.executable, "-S", "-m", "roctune.hardware.install_plan", "--json", "--root",
                          str(dm.cpu_only(tmp_path / "cpu"))], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert cpu.returncode == 0 and json.loads(cpu.stdout)["torch_index_url"] is None
