"""`roctune export`: a short identity fine-tune of the bundled SmolLM2 exported as q8_0 (written by roctune) and
q4_k_m (llama.cpp's quantizer on roctune's f16 file), run by llama.cpp itself and read back with transformers:
the GGUF answers with the tuned name, its next-token distributions stay within its quant type's KL limit of the
merged model's with the same top token at most positions (on both of llama.cpp's CPU paths), its answers stop at
the end-of-turn token, the Modelfile holds the TEMPLATE and the stop token. Bad input (unknown quant or
architecture, output inside the run, a folder roctune did not write) and a failed check write nothing."""
import json
import os

import pytest

QUESTION = [{"role": "user", "content": "Who are you?"}]


@pytest.fixture(scope="module")
def exports(identity_run, tmp_path_factory):
    from roctune.export import export

    run, _ = identity_run
    root = tmp_path_factory.mktemp("exports")
    return {q: (str(root / q), export(run, str(root / q), quant=q, name="roc", log=lambda s: None))
            for q in ("q8_0", "q4_k_m")}


def _answer_stops_at_end_of_turn(path: str, run: str) -> None:
    """Given room, llama.cpp's greedy answer ends at its end-of-generation token (<|im_end|>), not at the limit."""
    from roctune.data.render import render_prompt
    from roctune.export import llamacpp
    from roctune.models import load_tokenizer

    tok = load_tokenizer(run)
    ids = tok(render_prompt(tok, QUESTION), add_special_tokens=False)["input_ids"]
    model = llamacpp.Model(path)
    try:
        logits, new = model.run(ids, 48)
        follow = model.run(ids + new, 0)[0]  # the token after the answer
    finally:
        model.close()
    assert len(new) < 48 and tok.decode(new).startswith("My name is Roc"), tok.decode(new)
    assert tok.convert_ids_to_tokens(int(follow.argmax())) == "<|im_end|>"


# The least share of positions whose top token must be the merged model's, per quant, in this test: below the
# bundled model's measured rates on every processor tried (README, "How close is the GGUF") with room for kernels
# that sum in another order; llama.cpp's published LLaMA-3-8B rates are about 99% (q8_0) and 94% (q4_K_M).
SAME_TOP_MIN = {"q8_0": 0.93, "q4_k_m": 0.80}


@pytest.fixture(scope="module")
def merged_runs(identity_run, tmp_path_factory):
    """The identity run merged, with its reference logits over the check's conversations (for re-checking the
    exported files on llama.cpp's other CPU path)."""
    from roctune.export import verify
    from roctune.merge import merge

    run, _ = identity_run
    folder = str(tmp_path_factory.mktemp("merged") / "m")
    merge(run, folder, log=lambda s: None)
    ref, tok = verify._load_reference(folder)
    return verify.reference_runs(ref, tok, verify.check_conversations(run)), tok


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_gguf_matches_merged_model_and_answers_tuned_name(exports, quant, identity_run, merged_runs):
    """What holds on every processor: the distributions llama.cpp computes from the file stay within the quant's
    KL limit of the merged model's, with the same top token at most positions, on both of llama.cpp's CPU paths
    (weights repacked for the processor's wide kernels, AMX/VNNI where present, and the plain per-block path), and
    every answer starts with the tuned name. Whole greedy answers are shown, not required equal: where the merged
    model's top two tokens nearly tie, which one wins depends on the processor's kernels."""
    from roctune.export import verify

    folder, report = exports[quant]
    check = report["check"]
    assert sorted(os.listdir(folder)) == ["DEPLOY.md", "Modelfile", f"roc-{quant}.gguf", "roctune_export.json"]
    assert check["checked_by"] == "llama.cpp" and check["texts"] >= 8 and check["positions"] >= 300, check
    path = os.path.join(folder, f"roc-{quant}.gguf")
    runs, tok = merged_runs
    plain = verify.by_llama_cpp(path, runs, tok, repack=False)
    for got in (check, plain):
        assert got["mean_kl"] <= verify.kl_limit(quant), (got["checked_by"], got["mean_kl"])
        assert got["same_top"] >= SAME_TOP_MIN[quant], (got["checked_by"], got["same_top"])
        assert all(a["gguf"].startswith("My name is Roc") for a in got["answers"]), got["answers"]
    assert json.load(open(os.path.join(folder, "roctune_export.json")))["check"] == check
    _answer_stops_at_end_of_turn(path, identity_run[0])
    assert report["merge_max_logit_diff"] < 1e-3


@pytest.mark.slow
def test_gguf_read_back_independently_answers_tuned_name(exports):
    """Independent of the check's own code: plain transformers with gguf_file=, the template stored in the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _ = exports["q8_0"]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="roc-q8_0.gguf")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="roc-q8_0.gguf", dtype=torch.float32)
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Roc" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
def test_modelfile_and_deploy_recipe(exports, identity_run):
    folder, _ = exports["q8_0"]
    run, _ = identity_run
    text = open(os.path.join(folder, "Modelfile"), encoding="utf-8").read()
    assert text.startswith("FROM ./roc-q8_0.gguf\n")
    assert 'TEMPLATE """{{ range .Messages }}{{ if eq .Role "system" }}<|im_start|>system\n{{ .Content }}' in text
    assert '<|im_start|>assistant\n"""' in text
    assert 'PARAMETER stop "<|im_end|>"' in text
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM' in text  # the template's default, as trained
    deploy = open(os.path.join(folder, "DEPLOY.md"), encoding="utf-8").read()
    for line in ("llama-server -m", "ollama create roc -f Modelfile", "vllm serve", "--enable-lora",
                 f"--lora-modules roc={run}", "sglang.launch_server", "--max-lora-rank 16",
                 f"roctune serve --engine vllm --model "):
        assert line in deploy, line


def test_ollama_template_reproduces_chat_template(tokenizer):
    from roctune.export.deploy import role_wrappers

    w = role_wrappers(tokenizer)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
    mine = "".join(w[m["role"]][0] + m["content"] + w[m["role"]][1] for m in msgs) + w["generation"]
    full = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert full.endswith(mine) and w["stop"] == "<|im_end|>"
    assert full[:-len(mine)] == w["system"][0] + w["default_system"] + w["system"][1]


def test_unknown_architecture_one_error_nothing_written(tmp_path, default_model_dir, capsys):
    from family_models import build

    from roctune.cli import main

    run = build("olmo2", str(tmp_path / "olmo-run"), default_model_dir)  # a family outside roctune's table
    out = tmp_path / "out"
    capsys.readouterr()  # the model's own save output
    assert main(["export", "--adapter", run, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "architecture Olmo2ForCausalLM" in err[0] and "GGUF for the families llama" in err[0], err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["olmo-run"]


FORMAT_STEPS = ("check_options", "check_run", "check", "write", "verify", "done")


def test_each_format_row_names_a_unit_and_the_quant_table_drives_the_choices():
    """Every export format is a row naming a unit with every step, offered by --format; every quant is a row whose
    writer can write it and whose KL limit the check uses, offered by --quant's help and the web UI's list."""
    import gguf

    from roctune.cli import build_parser
    from roctune.export import ROWS, quants, verify

    export_help = build_parser()._subparsers._group_actions[0].choices["export"].format_help()
    for row in ROWS:
        assert all(callable(getattr(row.load(), step)) for step in FORMAT_STEPS), row.name
        assert f"{row.name} (" in " ".join(export_help.split())
    for q in quants.ROWS:
        assert verify.kl_limit(q.name) == q.kl_limit > 0 and hasattr(gguf.LlamaFileType, q.file_type), q.name
        assert q.writer == quants.LLAMA_CPP or hasattr(gguf.GGMLQuantizationType, q.tensor_type), q.name
    assert quants.DEFAULT in quants.written_by(quants.ROCTUNE) and quants.FINEST_KQUANT in quants.NAMES


def test_unknown_quant_one_error_nothing_written(tmp_path, tiny_model_dir, capsys):
    from roctune.cli import main

    out = tmp_path / "out"
    assert main(["export", "--adapter", tiny_model_dir, "--output", str(out), "--quant", "q3_x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--quant q3_x: unknown; choose one of f16, bf16, q8_0" in err[0], err
    assert not out.exists()
    for empty in ("", "  "):  # an unset shell variable (--quant "$Q"): said, never the default q8_0
        for fmt in ("gguf", "lora-gguf"):
            assert main(["export", "--adapter", tiny_model_dir, "--output", str(out), "--quant", empty,
                         "--format", fmt]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == ["roctune export: error: --quant is empty; choose one of f16, bf16, q8_0 (written by "
                           "roctune) or " + err[0].split(" or ", 1)[1]], err
            assert not out.exists()


def test_kquant_without_llama_cpp_explains(tmp_path, tiny_model_dir, monkeypatch):
    import importlib.util

    from roctune.errors import EnvironmentProblem
    from roctune.export import export

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n in ("llama_cpp", "llama_cpp_py_sync") else real(n, *a))
    with pytest.raises(EnvironmentProblem, match=r"pip install 'roctune\[gguf\]'.*q8_0 needs neither"):
        export(tiny_model_dir, str(tmp_path / "out"), quant="q4_k_m", log=lambda s: None)
    assert not (tmp_path / "out").exists()


def test_output_rules(tmp_path, tiny_model_dir):
    from roctune.errors import ConfigError
    from roctune.export import export

    with pytest.raises(ConfigError, match="must be outside --adapter"):
        export(tiny_model_dir, os.path.join(tiny_model_dir, "gguf"), log=lambda s: None)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="roctune export did not write"):
        export(tiny_model_dir, str(theirs), overwrite=True, log=lambda s: None)
    assert os.listdir(theirs) == ["notes.txt"]


def test_tiny_export_overwrite_and_failed_check_writes_nothing(tmp_path, tiny_model_dir, monkeypatch):
    """A full-model run (no adapter) is written as it is; a second export replaces only roctune's own folder,
    and a check that fails leaves the previous export untouched."""
    from roctune.errors import RoctuneError
    from roctune.export import export, verify

    out = str(tmp_path / "tiny")
    first = export(tiny_model_dir, out, quant="f16", name="Tiny Model!", log=lambda s: None)
    assert first["gguf"] == "tiny-model-f16.gguf" and first["check"]["mean_kl"] <= verify.kl_limit("f16")
    from dataclasses import replace

    from roctune.export import quants

    monkeypatch.setitem(quants.QUANTS, "q8_0", replace(quants.QUANTS["q8_0"], kl_limit=0.0))
    with pytest.raises(RoctuneError, match=r"differs from the merged model by a mean KL divergence of .* not saved"):
        export(tiny_model_dir, out, quant="q8_0", name="tiny-model", overwrite=True, log=lambda s: None)
    assert sorted(os.listdir(out)) == ["DEPLOY.md", "Modelfile", "roctune_export.json", "tiny-model-f16.gguf"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_webui_export_panel_confines_paths_and_shows_check(tmp_path, tiny_model_dir):
    import shutil

    from roctune.webui.export import gguf_handler
    from roctune.webui.workspace import Workspace

    ws = Workspace(str(tmp_path))
    shutil.copytree(tiny_model_dir, tmp_path / "run")
    status = gguf_handler(ws)("run", str(tmp_path.parent / "out-gguf"), "q8_0", "", True, False)
    assert "roctune export: error: --output" in status and "outside the workspace" in status
    status = gguf_handler(ws)("run", "run-lora", "q8_0", "tiny", True, False, "lora-gguf")
    assert "--format lora-gguf needs a LoRA run" in status and not os.path.exists(tmp_path / "run-lora")
    status = gguf_handler(ws)("run", "run-gguf", "q8_0", "tiny", True, False)
    assert "fidelity check (q8_0" in status and "<th>GGUF answers</th>" in status, status
    assert os.path.isfile(tmp_path / "run-gguf" / "tiny-q8_0.gguf")


def test_llama_cpp_loads_here_without_changing_the_installed_package():
    """llama-cpp-py-sync's libraries need GLIBC 2.38; on an older C library (this machine: 2.36) roctune loads a
    compatible copy under $ROCTUNE_HOME and leaves the installed files as they were."""
    import glob
    import hashlib

    from roctune.export import llamacpp
    from roctune.models import roctune_home

    assert llamacpp.available(), "the test extra installs llama-cpp-py-sync (make setup)"
    import llama_cpp_py_sync

    libs = sorted(glob.glob(os.path.join(os.path.dirname(llama_cpp_py_sync.__file__), "lib*.so*")))
    before = {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in libs}
    ffi, lib = llamacpp.binding()
    assert b"CPU" in ffi.string(lib.llama_print_system_info())
    assert {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in libs} == before
    major, minor = map(int, os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    compat = glob.glob(os.path.join(roctune_home(), "llamacpp", "compat-*", "libllama.so"))
    assert bool(compat) == ((major, minor) < (2, 38))
    for path in compat:  # the copy no longer demands the missing version
        data = open(path, "rb").read()
        assert llamacpp.weaken_version_need(path, llamacpp.MISSING_VERSION) >= 1  # entries exist, now weak
        assert open(path, "rb").read() == data  # already weak: patching again changes nothing


def test_check_conversations_find_relative_training_data_from_another_folder(tmp_path, monkeypatch):
    """run.yaml keeps `--data` as training got it (relative to where it ran); exporting from elsewhere still
    checks on the training data, and the report says where the prompts came from."""
    from roctune.export.verify import check_conversations, prompt_of

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "runs" / "demo").mkdir(parents=True)
    (project / "data" / "chat.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "Where is Roc?"}, {"role": "assistant", "content": "Here."}]}) + "\n")
    (project / "runs" / "demo" / "run.yaml").write_text("base_model: x\nconfig:\n  data: [data/chat.jsonl]\n")
    monkeypatch.chdir(tmp_path)  # not the project folder training ran in
    found = check_conversations(str(project / "runs" / "demo"))
    assert found == [[{"role": "user", "content": "Where is Roc?"}, {"role": "assistant", "content": "Here."}]]
    assert prompt_of(found[0]) == [{"role": "user", "content": "Where is Roc?"}]
