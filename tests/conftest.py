"""Shared fixtures: the bundled model (converted once into a cache inside the repo), tiny random models built
from a config (no downloads), and small dataset files in every supported format."""
from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ROCTUNE_HOME", os.path.join(REPO, ".cache", "roctune"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers on a 2-core machine: one thread each (and in the processes they start),
    # as two processes with a thread per core each slow each other by up to 8x through oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# The files that take longest under `make test` (40-125 s each: browser walks, vLLM servers, GGUF exports, the
# family matrix), collected first: pytest-xdist hands whole files (--dist loadfile --no-loadscope-reorder, the
# Makefile) to the two workers in collection order, and in alphabetical order the web UI files came last, where one
# worker ran them while the other had nothing left. (Without --no-loadscope-reorder xdist orders the files by their
# number of tests instead.) Not test_serve_agents.py: it waits for the agent run that test_serve_vllm.py trains
# (conftest.built_once).
HEAVY_FIRST = ("test_webui_zh.py", "test_webui.py", "test_export.py", "test_families.py", "test_grpo_vllm.py",
               "test_serve_vllm.py", "test_export_families.py", "test_distributed.py", "test_agents.py",
               "test_templates.py", "test_model_from_gguf.py", "test_compile.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def patient_gradio_launch():
    """Gradio's launch asks its own page once with a 3 s timeout and, on a timeout, refuses to start ("localhost is
    not accessible"); on this 2-core machine with two test workers busy the first answer can take longer. The tests
    are about roctune's page, so they wait up to 60 s for it."""
    try:
        from gradio import networking
    except ImportError:
        yield
        return
    import time

    import httpx

    quick = networking.url_ok

    def patient(url: str) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.head(url, timeout=10, verify=False).status_code in (200, 401, 301, 302, 303, 307, 308):
                    return True
            except (httpx.ConnectError, httpx.TimeoutException):
                pass
            time.sleep(0.5)
        return quick(url)

    networking.url_ok = patient
    yield
    networking.url_ok = quick


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    from roctune.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from roctune.models import load_tokenizer

    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> str:
    """A 2-layer llama with hidden size 64 and the bundled model's tokenizer and chat template."""
    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")), default_model_dir, heads=4, kv_heads=2)


def build_tiny_llama(path: str, tokenizer_dir: str, heads: int, kv_heads: int, hidden: int = 64) -> str:
    """A 2-layer llama of hidden size `hidden` (head size hidden / heads) with `tokenizer_dir`'s tokenizer, saved in
    `path`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


def files_in(root) -> dict[str, bytes]:
    """Every file below `root` (relative path -> bytes): compared before and after, it shows what was written."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


@contextlib.contextmanager
def served_page(root):
    """The web UI confined to `root`, started the way `roctune webui` starts it (roctune.webui.launch) on a free
    loopback port without blocking: yields (gradio_client Client, app); closed after."""
    pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    from gradio_client import Client

    from roctune.hardware.network import free_port
    from roctune.webui import launch

    port = free_port()
    app = launch(port=port, root=str(root), block=False)
    try:
        yield Client(f"http://127.0.0.1:{port}", verbose=False), app
    finally:
        app.close()


@pytest.fixture
def alpaca_file(tmp_path) -> str:
    rows = [{"instruction": f"Say the word number {i}.", "input": "", "output": f"Word {i}: banana."} for i in range(12)]
    return write_jsonl(tmp_path / "alpaca.jsonl", rows)


IDENTITY = os.path.join(REPO, "examples", "identity.jsonl")


def built_once(tmp_path_factory, name: str, build) -> str:
    """The folder `name`, built by `build(folder)` once per test session, also across `make test`'s two pytest
    workers: each worker has its own session fixtures, so a fixture used by test files on both workers trained
    twice (30-40 s each on this machine). The first worker builds under a file lock; the other waits and reuses."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common temp folder
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build on the other worker left
            folder.mkdir()
            build(str(folder))
            done.touch()
    return str(folder)


@pytest.fixture(scope="session")
def identity_run(tmp_path_factory, default_model_dir):
    """The bundled model taught its new name (examples/identity.jsonl, 14 steps at a high LR); (run dir, summary).
    Shared by the integration and export tests, so the run is trained once."""
    from roctune.config import TrainConfig
    from roctune.recipes import train

    def build(folder: str) -> None:
        out = os.path.join(folder, "run")
        cfg = TrainConfig(data=[IDENTITY], output=out, max_steps=14, batch_size=4, grad_accum=1, lr=3e-3,
                          lora_r=16, lora_alpha=32, max_length=128, device="cpu", seed=1)
        summary = train(cfg, log=lambda s: None, progress=False)
        with open(os.path.join(folder, "summary.json"), "w") as f:
            json.dump(summary, f)

    folder = built_once(tmp_path_factory, "identity", build)
    with open(os.path.join(folder, "summary.json")) as f:
        return os.path.join(folder, "run"), json.load(f)


@pytest.fixture(scope="session")
def agent_run(tmp_path_factory, default_model_dir) -> str:
    """The bundled model taught tool calls and reasoning (tests/agent_data.py, 12 steps): the run directory. Shared
    by the serve tests of both engines (tests/test_serve_agents.py, tests/test_serve_vllm.py)."""
    from agent_data import rows
    from roctune.config import TrainConfig
    from roctune.recipes import train

    def build(folder: str) -> None:
        data = write_jsonl(os.path.join(folder, "agent.jsonl"), rows())
        cfg = TrainConfig(data=[data], output=os.path.join(folder, "agent"), max_steps=12, lr=3e-3, batch_size=2,
                          grad_accum=1, lora_r=16, lora_alpha=32, lora_dropout=0.0, max_length=320, device="cpu",
                          seed=1)
        cfg.validate()
        train(cfg, log=lambda s: None, progress=False)

    return os.path.join(built_once(tmp_path_factory, "agent", build), "agent")


def run_train(cfg):
    """Train quietly; returns (summary, logged lines)."""
    from roctune.recipes import train

    lines = []
    return train(cfg, log=lines.append, progress=False), lines


def read_metrics(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def cpu_train_cfg(data, output, model, **kw):
    """A short training on the CPU with the settings the stage tests share; `kw` overrides them (each stage's test
    file binds its own with functools.partial)."""
    from roctune.config import TrainConfig

    base = dict(data=data if isinstance(data, list) else [str(data)], output=str(output), model=model, device="cpu",
                batch_size=2, grad_accum=1, max_length=64, lr=5e-3, lora_dropout=0.0)
    base.update(kw)
    return TrainConfig(**base)


def resume_after_a_kill(make, straight, out) -> list[str]:
    """`make(output, **more)` -> TrainConfig of a 4-step run; `straight` holds it trained without a stop. Trains it
    into `out` with a checkpoint every 2 steps, removes what a kill after step 2 would not have written (checkpoint-4,
    the later metrics rows and the final adapter), resumes, and checks that the resume says so and logs the
    losses of the uninterrupted run. Returns the resumed run's log lines."""
    import shutil

    run_train(make(out, save_steps=2))
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-2", "checkpoint-4"]
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    kept = [r for r in read_metrics(out) if r["step"] <= 2]
    with open(os.path.join(out, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.unlink(os.path.join(out, "adapter_model.safetensors"))
    _, lines = run_train(make(out, save_steps=2, resume=True))
    assert "resumed from step 2" in lines

    def losses(run_dir):
        return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]

    assert losses(out) == pytest.approx(losses(straight), abs=1e-6)
    return lines


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory, default_model_dir):
    """family -> its tiny model directory (tests/family_models.py), built on first use; shared by the family
    matrix and the export tests (Qwen's tokenizer alone takes seconds to build)."""
    import family_models

    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            folder = tmp_path_factory.mktemp(f"family-{family}")
            built[family] = family_models.build(family, str(folder), default_model_dir)
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory, default_model_dir) -> str:
    """The tiny Idefics3 (SmolVLM-layout) model with its processor (tests/vision_models.py)."""
    import vision_models

    return vision_models.build("idefics3", str(tmp_path_factory.mktemp("tiny-vlm")), default_model_dir)


@pytest.fixture(scope="session")
def vlm_lora_dir(tmp_path_factory, tiny_vlm_dir) -> str:
    """A LoRA adapter on the tiny VLM's language model, vision tower and connector (random, non-zero)."""
    import vision_models

    return vision_models.lora_adapter(tiny_vlm_dir, str(tmp_path_factory.mktemp("vlm-lora")),
                                      vision_models.BOTH_TARGETS)
