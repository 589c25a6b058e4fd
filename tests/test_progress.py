"""Long phases report a count and an ETA; short ones stay silent. Every phase that reports is run here with
`progress.EVERY = 0` (a line per item) and its lines are checked: label, done/total, eta."""
import json
import os
import re
import sys
from types import SimpleNamespace

import pytest

from conftest import run_train, write_jsonl
from roctune import progress
from roctune.progress import Counted, Meter, counted


def test_counted_reports_count_and_eta_and_keeps_the_items():
    lines = []
    assert list(counted(range(5), "tokenizing", lines.append, every=0.0)) == [0, 1, 2, 3, 4]
    assert [line.split("  ")[0] for line in lines] == ["tokenizing 1/5", "tokenizing 2/5", "tokenizing 3/5",
                                                       "tokenizing 4/5"]
    assert all(line.split("  ")[1].startswith("eta ") for line in lines)


def test_a_short_phase_is_silent_and_len_is_kept():
    lines = []
    wrapped = Counted(list("abc"), "evaluating", lines.append)  # default: a line only after 5 s
    assert len(wrapped) == 3 and list(wrapped) == ["a", "b", "c"] and lines == []


# ----------------------------------------------------------------- every long phase reports (EVERY = 0 here)
NUMBER = r"(\d+(?:\.\d+)?)"


def counts(lines, label: str, unit: str = "") -> list[tuple[float, float]]:
    """(done, total) of every progress line of `label`; a line that only starts like one fails the test."""
    pattern = re.compile(rf"{re.escape(label)} {NUMBER}/{NUMBER}{unit}  eta \d+:\d\d")
    found = []
    for line in lines:
        if line.startswith(label + " "):
            m = pattern.fullmatch(line)
            assert m, f"not a progress line: {line!r}"
            found.append((float(m[1]), float(m[2])))
    return found


@pytest.fixture
def every_line(monkeypatch):
    monkeypatch.setattr(progress, "EVERY", 0.0)


def test_meter_reports_bytes_with_an_eta_and_stays_silent_when_short():
    lines = []
    meter = Meter(3 * 2**20, "checking", lines.append, every=0.0, in_bytes=True)
    for done in (2**20, 2 * 2**20, 3 * 2**20):  # the last update (all done) says nothing
        meter.update(done)
    assert counts(lines, "checking", " MiB") == [(1.0, 3.0), (2.0, 3.0)]
    quiet = []
    meter = Meter(100, "scrubbing", quiet.append)  # default EVERY: nothing within 5 s
    meter.update(50)
    assert quiet == []


@pytest.fixture(scope="module")
def tiny_lora_run(tmp_path_factory, tiny_model_dir):
    """A 2-step LoRA run of the tiny model with an eval split, trained with every progress line on:
    (run dir, its log lines)."""
    from roctune.config import TrainConfig

    root = tmp_path_factory.mktemp("progress-run")
    data = write_jsonl(root / "d.jsonl", [{"instruction": f"Say {i}.", "input": "", "output": f"{i} banana."}
                                          for i in range(12)])
    cfg = TrainConfig(data=[data], output=str(root / "run"), model=tiny_model_dir, device="cpu", max_steps=2,
                      batch_size=2, grad_accum=1, max_length=64, eval_ratio=0.5, seed=0, data_cache=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progress, "EVERY", 0.0)
        _, lines = run_train(cfg)
    return cfg.output, lines


def test_merge_counts_the_layers_it_merges(tiny_lora_run, tmp_path, every_line):
    from roctune.merge import merge

    run, _ = tiny_lora_run
    lines = []
    merge(run, str(tmp_path / "merged"), log=lines.append)
    n_layers = 2 * 4  # 2 decoder layers x q, k, v, o
    assert counts(lines, "merging layer") == [(i, n_layers) for i in range(1, n_layers)], lines


def test_export_counts_tensors_written_and_conversations_checked(tiny_model_dir, tmp_path, every_line):
    from roctune.export import export

    lines = []
    report = export(tiny_model_dir, str(tmp_path / "gguf"), quant="f16", log=lines.append)
    n = report["tensors"]
    assert n == 1 + 2 * 9 + 1  # embeddings, 2 layers of 7 matrices and 2 norms, the final norm (lm_head tied)
    assert counts(lines, "writing gguf tensor") == [(i, n) for i in range(1, n)], lines
    texts = report["check"]["texts"]  # the fidelity check runs whole conversations, counted one by one
    assert texts > 1
    assert counts(lines, "checking gguf conversation") == [(i, texts) for i in range(1, texts)], lines


def _bytes_lines(err: str, label: str) -> list[tuple[float, float]]:
    found = counts(err.splitlines(), label, " KiB")
    assert found, err
    dones = [d for d, _ in found]
    assert dones == sorted(dones) and all(0 < d <= total for d, total in found)  # shown to 0.1 KiB
    return found


def test_data_check_reports_bytes_read_of_train_and_eval_files(tmp_path, capsys, every_line):
    from roctune.cli import main

    rows = [{"instruction": f"question {i} " * 20, "output": f"answer {i} " * 20} for i in range(40)]
    train = write_jsonl(tmp_path / "a.jsonl", rows)
    array = tmp_path / "b.json"
    array.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    evals = write_jsonl(tmp_path / "e.jsonl", rows[:10])
    assert main(["data", "check", train, str(array), "--eval", evals, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["records"] == 80  # stdout stays the report alone
    total = sum(os.path.getsize(p) for p in (train, array, evals)) / 1024
    found = _bytes_lines(err, "checking")
    assert {t for _, t in found} == {round(total, 1)}
    assert max(d for d, _ in found) > (total - os.path.getsize(array) / 1024)  # it went on into the JSON array


def test_data_scrub_reports_bytes_read_for_jsonl_and_json_arrays(tmp_path, capsys, every_line):
    from roctune.cli import main

    rows = [{"instruction": f"call me on 13812345678 about {i} " * 10, "output": "ok " * 30} for i in range(40)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    assert main(["data", "scrub", src, str(tmp_path / "out.jsonl")]) == 0
    found = _bytes_lines(capsys.readouterr().err, "scrubbing")
    assert {t for _, t in found} == {round(os.path.getsize(src) / 1024, 1)}
    array = tmp_path / "in.json"
    array.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    assert main(["data", "scrub", str(array), str(tmp_path / "out.json")]) == 0
    _bytes_lines(capsys.readouterr().err, "scrubbing")


def test_webui_train_status_comes_from_the_status_file_not_the_log(tiny_lora_run):
    from roctune.webui.jobs import TrainJob
    from roctune.webui.train import running_status

    job = TrainJob([sys.executable, "-m", "roctune", "train", "--config", "x.yaml"], "out",
                   SimpleNamespace(poll=lambda: None), "log")
    assert running_status(job, {"phase": "tokenizing"}) == ("running: tokenizing the data\n"
                                                            "started: roctune train --config x.yaml")
    assert running_status(job, None).startswith("running: starting\n")
    job.stopped = True
    assert running_status(job, {"phase": "training"}).startswith("stopping...\n")


def test_webui_train_tick_reads_the_phase_from_status_json(tiny_lora_run, tmp_path):
    """The log's wording does not matter: a log with no phase line at all still shows the run's phase and step."""
    gr = pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    import shutil

    from roctune import rundir
    from roctune.webui.jobs import TrainJob
    from roctune.webui.train import tick_handler

    run = str(tmp_path / "run")
    shutil.copytree(tiny_lora_run[0], run)
    rundir.write_status(run, "evaluating", step=2, total=2, eta_s=3.0, metrics={"loss": 1.5})
    log = tmp_path / "train.log"
    log.write_text("nothing a parser could use\n", encoding="utf-8")
    job = TrainJob(["python", "-m", "roctune", "train"], run, SimpleNamespace(poll=lambda: None), str(log))
    status, prog = tick_handler(gr, {"job": job}, 0)()[:2]
    assert "running: evaluating" in status and "started: roctune train" in status, status
    assert prog.endswith('<div id="rt-progress-text">evaluating | step 2/2 | loss 1.5000 | ETA 0:03</div>')
    assert 'role="progressbar" aria-valuenow="2" aria-valuemax="2"' in prog  # the bar: step 2 of 2


def test_a_stop_signal_swallowed_by_a_finalizer_stops_at_the_next_progress_point(monkeypatch):
    """A SIGTERM (or Ctrl-C) whose KeyboardInterrupt a __del__ swallowed ("Exception ignored in ...") is raised
    again by the next progress update, so the command still stops (roctune.interrupts)."""
    import os
    import signal
    import sys

    from roctune import interrupts
    from roctune.progress import Progress, counted

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the finalizer runs
            for _ in range(10_000):  # the handler runs at the next bytecode check, inside this method
                pass

    swallowed = []  # what Python would print as "Exception ignored in ..."
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    previous = interrupts.install()
    try:
        Finalized()  # freed at once: its __del__ swallows the KeyboardInterrupt and execution goes on
        assert swallowed == [KeyboardInterrupt]
        with pytest.raises(KeyboardInterrupt):
            for _ in counted(range(3), "items", lambda s: None):
                pass
        with pytest.raises(KeyboardInterrupt):
            Progress(3, enabled=False).update(1, "", lambda s: None)
    finally:
        interrupts.restore(previous)
    for _ in counted(range(3), "items", lambda s: None):  # a new command starts with no stop pending
        pass
