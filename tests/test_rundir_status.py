"""rundir.status.running: the status.json bookkeeping around one training run (no model: the block stands in for
the recipe)."""
from __future__ import annotations

import pytest

from roctune import rundir


def test_a_run_that_completes_ends_done_with_the_fields_it_gave(tmp_path):
    out = str(tmp_path / "run")
    with rundir.status.running(out) as end:
        assert rundir.read_status(out)["phase"] == "starting"
        rundir.write_status(out, "training", step=2, total=4)
        end["step"] = 4
    status = rundir.read_status(out)
    assert (status["phase"], status["step"], status["total"], status["eta_s"]) == ("done", 4, 4, 0)
    assert rundir.run_state(out) == "done"


def test_a_run_that_fails_before_its_first_step_leaves_nothing(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError), rundir.status.running(str(out)):
        rundir.write_status(str(out), "loading")
        raise RuntimeError("the model does not load")
    assert not out.exists()  # the folder it made is removed again


def test_an_early_failure_puts_back_the_status_it_found(tmp_path):
    out = str(tmp_path)
    rundir.write_run(out, {"base_model": "m", "config": {}})
    rundir.write_status(out, "done", step=7)
    before = open(rundir.status_path(out), encoding="utf-8").read()
    with pytest.raises(ValueError), rundir.status.running(out):
        raise ValueError("--resume refused")
    assert open(rundir.status_path(out), encoding="utf-8").read() == before


@pytest.mark.parametrize("error, state", [(KeyboardInterrupt(), "stopped"), (OSError("disk full"), "failed")])
def test_a_run_that_ends_after_it_started_training_says_how(tmp_path, error, state):
    out = str(tmp_path / "run")
    with pytest.raises(type(error)), rundir.status.running(out):
        rundir.write_run(out, {"base_model": "m", "config": {}})
        rundir.write_status(out, "training", step=1, total=3)
        raise error
    status = rundir.read_status(out)
    assert status["phase"] == state and status["step"] == 1
    assert (status.get("error") == "OSError: disk full") == (state == "failed")


def test_a_new_run_failing_after_writing_run_yaml_is_recorded_as_failed(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(RuntimeError), rundir.status.running(out):
        rundir.write_run(out, {"base_model": "m", "config": {}})
        raise RuntimeError("a reward file fails")  # still in "starting": but this new run wrote run.yaml
    assert rundir.read_status(out)["phase"] == "failed" and rundir.is_unsaved_ended_run(out)
