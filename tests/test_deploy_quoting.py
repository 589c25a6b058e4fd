"""DEPLOY.md's commands are pasted into a shell: every path and name in them is quoted, so a file named
`x$(touch pwned).gguf` or a folder with spaces stays one argument and runs nothing (issue 46)."""
from __future__ import annotations

import re
import shlex

from roctune.export.deploy import deploy_md, lora_deploy_md

HOSTILE = "/tmp/out dir/x$(touch pwned)`id`;rm -rf ~"


def commands(md: str) -> list[list[str]]:
    """Every line of every ``` block, split as a POSIX shell would split it (no expansion happens in shlex)."""
    blocks = re.findall(r"```\n(.*?)```", md, re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def test_merged_deploy_commands_keep_hostile_paths_as_single_words():
    md = deploy_md(HOSTILE, "m$(id).gguf", "my model", HOSTILE + "/run", HOSTILE + "/base", 8, full_model=False)
    words = [w for cmd in commands(md) for w in cmd]
    assert HOSTILE + "/m$(id).gguf" in words  # llama-server -m PATH
    assert HOSTILE in words  # cd OUTPUT
    assert "my model" in words and HOSTILE + "/base" in words
    assert f"my model={HOSTILE}/run" in words  # --adapter NAME=RUN and --lora-modules
    md = deploy_md(HOSTILE, "m.gguf", "n", HOSTILE + "/run", "b", None, full_model=True)
    assert [HOSTILE + "/run"] == [w for cmd in commands(md) for w in cmd if w.startswith(HOSTILE + "/run")][:1]


def test_lora_deploy_commands_keep_hostile_paths_as_single_words():
    for base_gguf in (HOSTILE + "/base.gguf", None):
        md = lora_deploy_md("lora$(id).gguf", "n;id", HOSTILE, base_gguf)
        words = [w for cmd in commands(md) for w in cmd]
        assert "lora$(id).gguf" in words and "n;id" in words
        if base_gguf:
            assert base_gguf in words
