"""The numeric self-test: it passes on this machine, and names the piece when a kernel is made wrong."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from roctune.commands import doctor as doctor_cmd
from roctune.config import TrainConfig
from roctune.doctor import selftest as st
from roctune.errors import EnvironmentProblem


def by_id(findings):
    return {f.id: f for f in findings}


def test_passes_on_this_machine():
    found = by_id(st.selftest())
    assert all(f.level == "ok" for f in found.values()), [(f.id, f.message, f.why) for f in found.values()]
    assert {"selftest.path", "selftest.attn.eager", "selftest.attn.sdpa", "selftest.packing", "selftest.4bit"} <= set(found)
    assert "float64" in found["selftest.attn.sdpa"].why


def test_wrong_attention_kernel_is_named(monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention

    def wrong(q, k, v, *args, **kwargs):  # a kernel that runs but mixes up the heads' values
        return real(q, k, v.flip(-1), *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", wrong)
    found = by_id(st.selftest(four_bit=False))
    assert found["selftest.attn.sdpa"].level == "fail" and "wrong numbers" in found["selftest.attn.sdpa"].message
    assert "--attn eager" in found["selftest.attn.sdpa"].fix
    assert found["selftest.attn.eager"].level == "ok"  # the broken piece, not everything, is named


def test_wrong_4bit_matmul_is_named(monkeypatch):
    bnb = pytest.importorskip("bitsandbytes")
    if st.check_4bit(st.tiny_config(), _state(), "cpu", "fp32", "sdpa").message.startswith("4-bit (QLoRA) not tested"):
        pytest.skip("bitsandbytes has no working 4-bit build here")
    real = bnb.matmul_4bit
    monkeypatch.setattr(bnb, "matmul_4bit", lambda *a, **k: real(*a, **k) * 1.05)
    f = st.check_4bit(st.tiny_config(), _state(), "cpu", "fp32", "sdpa")
    assert f.id == "selftest.4bit" and f.level == "fail" and "4-bit" in f.message and "--method lora" in f.fix


def _state():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(st.tiny_config(), attn_implementation="eager").state_dict()


def test_a_kernel_that_raises_is_a_named_failure(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("HIP error: invalid device function")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", broken)
    found = by_id(st.selftest(four_bit=False))
    sdpa = found["selftest.attn.sdpa"]
    assert sdpa.level == "fail" and "invalid device function" in sdpa.message
    assert found["selftest.packing"].level == "fail"


def test_doctor_selftest_cli_and_train_require(monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="roctune")
    doctor_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--selftest", "--json", "--no-tools"])
    monkeypatch.setattr(st, "check_4bit", lambda *a: st.Finding("selftest.4bit", "fail", "4-bit broken", "", "fix"))
    code = args.func(args)
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["verdict"] == "fail"
    assert {f["id"] for f in data["findings"] if f["id"].startswith("selftest")} >= {"selftest.attn.sdpa", "selftest.4bit"}
    cfg = TrainConfig(selftest=True, method="qlora")
    with pytest.raises(EnvironmentProblem, match="self-test: 4-bit broken"):
        st.require(cfg)
    said = []
    st.require(TrainConfig(selftest=True), say=said.append)  # lora: 4-bit is not part of the path
    assert said and said[0].startswith("self-test passed: cpu fp32")
