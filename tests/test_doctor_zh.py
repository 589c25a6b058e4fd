"""`roctune doctor`'s findings on the web UI's Chinese page: every sentence a check can write has its Chinese
(roctune/doctor/zh.py), the catalog holds nothing else, and the findings of simulated machines (AMD, NVIDIA, WSL,
CPU; broken and working) read in Chinese with only names left in English (the CLI and its JSON stay English)."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import doctor_machines as dm  # noqa: E402

from roctune import doctor, hardware  # noqa: E402

ROOT = Path(__file__).parent.parent / "roctune"
# where findings are written: readiness and choices (hardware), doctor's own advice
CHECK_FILES = ["hardware/readiness.py", "hardware/choices.py", "doctor/checks_torch.py", "doctor/checks_libs.py",
               "doctor/checks_gpu.py", "doctor/checks_wsl.py"]
XTX = ("Radeon RX 7900 XTX", "gfx1100", 24 * dm.GiB)
# names of hardware and software a Chinese sentence keeps (the page's allow-list has the common ones)
NAMES = {"HIP", "KFD", "PCI", "Radeon", "RDNA", "Triton", "Ampere", "BIOS", "RCCL", "NCCL", "Windows", "Linux",
         "False", "XGMI"}


def _trees():
    for rel in CHECK_FILES:
        yield rel, ast.parse((ROOT / rel).read_text(encoding="utf-8"))


def _written_templates() -> set[str]:
    """The literal templates of every Text(...) and the separators of every Text.join(...) in the checks, and the
    reasons of choose_dtype and choose_attention (a Choice's reason, which doctor says as a Text)."""
    out = set()
    for rel, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "id", None)
            if name == "Choice" and isinstance(node.args[-1], ast.Constant):
                out.add(node.args[-1].value)
            elif isinstance(node.args[0], ast.Constant) and (name == "Text" or (
                    isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                    and getattr(node.func.value, "id", None) == "Text")):
                out.add(node.args[0].value)
    return out


def test_every_sentence_of_the_checks_has_its_chinese_and_the_catalog_nothing_else():
    from roctune.doctor.zh import ZH
    from roctune.hardware.gpus import ARCHS

    written = _written_templates() | {a.note for a in ARCHS.values() if a.note}
    assert not sorted(written - set(ZH)), "templates without Chinese in roctune/doctor/zh.py"
    assert not sorted(set(ZH) - written), "entries in roctune/doctor/zh.py no check writes"
    for english, chinese in ZH.items():  # the same placeholders on both sides
        assert sorted(re.findall(r"{(\w+)}", english)) == sorted(re.findall(r"{(\w+)}", chinese)), english


def test_every_finding_says_its_message_and_reason_as_a_text():
    """A message or reason written as a plain string (an f-string) could not be said in Chinese: each is a Text
    (or a value: a variable, a name list); fixes may be plain commands."""
    plain = []
    for rel, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add" and len(node.args) >= 3:
                for arg in node.args[2:4]:
                    if isinstance(arg, ast.JoinedStr) or (isinstance(arg, ast.Constant) and arg.value):
                        plain.append(f"{rel}:{arg.lineno}")
    assert not plain, plain


def _machines(tmp: Path):
    """(root, torch facts, user, env) of machines that between them make most findings."""
    rx6700 = dm.rocm_torch([("RX 6700 XT", "gfx1031", 12 * dm.GiB)], arch_list=dm.ROCM_ARCH_LIST)
    fa_bad = {"installed": True, "version": "2.7.0", "importable": False, "error": "undefined symbol",
              "build": "cuda"}
    bnb = {"installed": True, "version": "0.48.0", "libs": ["libbitsandbytes_rocm62.so"]}
    return [
        (dm.cpu_only(tmp / "cpu"), dm.cpu_torch(bitsandbytes=bnb, flash_attn=fa_bad), "alice", {}),
        (dm.cpu_only(tmp / "cpu-none"), {"backend": "none", "error": "No module named 'torch'"}, "alice", {}),
        (dm.nvidia(tmp / "nv"), dm.cuda_torch(flash_attn={"installed": True, "version": "2.7.0"}), "alice", {}),
        (dm.nvidia(tmp / "nv-cpu"), dm.cpu_torch(), "alice", {}),
        (dm.nvidia(tmp / "nv-old"), dm.cuda_torch(capability="6.1"), "alice", {}),
        (dm.nvidia(tmp / "nv-none", driver=None), dm.cuda_torch(cuda_available=False, devices=[]), "alice", {}),
        (dm.amd(tmp / "xtx", [dm.RX7900XTX]), dm.rocm_torch([XTX], bitsandbytes=bnb, flash_attn=fa_bad), "alice",
         {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}),
        (dm.amd(tmp / "xtx-cpu", [dm.RX7900XTX]), dm.cpu_torch(), "alice", {}),
        (dm.amd(tmp / "xtx-open", [dm.RX7900XTX], users={"alice": []}, dev_mode=0o666),
         dm.rocm_torch([XTX], packages={"transformers": None, "peft": "0.17.0"}), "alice",
         {"HSA_OVERRIDE_GFX_VERSION": "11.0.1"}),
        (dm.amd(tmp / "6700", [dm.RX6700XT]), rx6700, "alice", {"HSA_OVERRIDE_GFX_VERSION": "banana"}),
        (dm.amd(tmp / "6700-ok", [dm.RX6700XT]), rx6700, "alice", {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}),
        (dm.amd(tmp / "580", [dm.RX580]), dm.rocm_torch([("Radeon RX 580 Series", "gfx803", 8 * dm.GiB)]), "alice",
         {}),
        (dm.amd(tmp / "5700", [dm.RX5700XT]), dm.rocm_torch([("RX 5700 XT", "gfx1010", 8 * dm.GiB)]), "alice",
         {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}),
        (dm.amd(tmp / "9070", [dm.RX9070XT]), dm.rocm_torch([("RX 9070 XT", "gfx1201", 16 * dm.GiB)],
                                                          arch_list=["gfx1100"]), "alice", {}),
        (dm.amd(tmp / "mi300", [dm.MI300X, dm.MI300X], xgmi=True), dm.rocm_torch([("MI300X", "gfx942", dm.GiB)] * 2),
         "alice", {"NCCL_P2P_DISABLE": "1"}),
        (dm.amd(tmp / "pair", [dm.RX7900XTX, dm.RX6700XT], cmdline="quiet"), dm.rocm_torch([XTX, XTX]), "alice", {}),
        (dm.amd(tmp / "hidden", [dm.RX7900XTX]), dm.rocm_torch([]), "alice", {"HIP_VISIBLE_DEVICES": "-1"}),
        (dm.amd(tmp / "groups", [dm.RX7900XTX], users={"alice": ["video"]}), dm.rocm_torch([]), "alice", {}),
        (dm.amd(tmp / "stranger", [dm.RX7900XTX]), dm.rocm_torch([XTX]), "mallory", {}),
        (dm.amd(tmp / "docker", [dm.RX7900XTX], kfd=False, container=True), dm.rocm_torch([]), "alice", {}),
        (dm.amd(tmp / "nokfd", [dm.RX7900XTX], kfd=False, kfd_sysfs=False), dm.rocm_torch([]), "alice", {}),
        (dm.wsl(tmp / "wsl"), dm.cpu_torch(), "alice", {}),
        (dm.wsl(tmp / "wsl-bare", rocm_runtime=False), dm.rocm_torch([XTX]), "alice", {}),
        (dm.wsl(tmp / "wsl-nv", rocm_runtime=False, rocm=None, cuda=True), dm.cuda_torch(), "alice", {}),
        (dm.wsl(tmp / "wsl-nodxg", dxg=False), dm.cpu_torch(), "alice", {}),
    ]


@pytest.fixture
def clean_env(monkeypatch):
    for key in hardware.ENV_KEYS + (doctor.TORCH_FACTS_ENV,):
        monkeypatch.delenv(key, raising=False)


def test_simulated_machines_findings_read_in_chinese(tmp_path, clean_env):
    """Each finding of each machine as the Chinese page shows it: with names and commands (code) taken out, no
    English word outside the page's allow-list and the hardware names above."""
    from test_webui_zh import words_of

    from roctune.hardware.text import Text, templates_of
    from roctune.webui.doctor import finding_row
    from roctune.webui.i18n import language

    seen, english = set(), {}
    for root, facts, user, env in _machines(tmp_path):
        report = doctor.diagnose(hardware.gather(str(root), user, facts, env=env))
        for f in report.findings:
            seen.update(t for part in (f.message, f.why, f.fix) for t in templates_of(part))
            assert isinstance(f.message, Text), (f.id, f.message)
            with language("zh"):
                row = finding_row(f)
            shown = re.sub(r"<code>.*?</code>|<[^>]+>|&[#\w]+;", " ", row)
            words = words_of([shown], NAMES)
            if words:
                english[f"{root.name}:{f.id}"] = (sorted(words), shown)
    assert not english, english
    # the machines above make most of the sentences (all have their Chinese: the static test above)
    assert len(seen) >= 0.7 * len(_written_templates()), sorted(_written_templates() - seen)
