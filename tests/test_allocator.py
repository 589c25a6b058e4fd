"""Transparent huge pages for PyTorch's large CPU tensors (roctune.hardware.allocator): set for roctune's own
processes unless the user chose, effective in torch, and kept away from `roctune bench`'s baseline."""
from __future__ import annotations

import os
import subprocess
import sys

from roctune.hardware import allocator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_set_before_torch_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(allocator, "_set_by_roctune", False)
    env: dict[str, str] = {"PATH": "/bin"}
    assert allocator.use_huge_pages(env, modules={}) is sys.platform.startswith("linux")
    if sys.platform.startswith("linux"):
        assert env[allocator.ENV] == "1"
        assert allocator.users_environment(env) == {"PATH": "/bin"}  # the baseline runs as the user would
    monkeypatch.setattr(allocator, "_set_by_roctune", False)
    user = {allocator.ENV: "0"}
    assert allocator.use_huge_pages(user, modules={}) is False and user == {allocator.ENV: "0"}
    assert allocator.users_environment(user) == {allocator.ENV: "0"}
    late: dict[str, str] = {}
    assert allocator.use_huge_pages(late, modules={"torch": object()}) is False and late == {}


def _child(code: str, env: dict | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if k != allocator.ENV}
    env = {**base, "PYTHONPATH": ROOT, **(env or {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


CODE = ("import os\nfrom roctune import cli\n"
        "try:\n    cli.main(['estimate', '--help'])\nexcept SystemExit:\n    pass\n"
        "import torch\nx = torch.ones(64 * 2 ** 20 // 4)\n"
        "huge = [l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0].split()[1]\n"
        "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), huge)")


def test_the_cli_turns_it_on_and_torch_backs_large_tensors_with_huge_pages():
    setting, huge_kib = _child(CODE).splitlines()[-1].split()
    assert setting == "1"
    with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="utf-8") as f:
        mode = f.read()
    if "[never]" not in mode:  # "always" or "madvise": the 64 MiB tensor sits (mostly) on 2 MiB pages
        assert int(huge_kib) >= 32 * 1024, (mode, huge_kib)
    if "[madvise]" in mode:  # only the variable asks for them: a user's 0 is kept and gets none
        setting, huge_kib = _child(CODE, {allocator.ENV: "0"}).splitlines()[-1].split()
        assert setting == "0" and int(huge_kib) < 32 * 1024, huge_kib
