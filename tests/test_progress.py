"""Long phases report a count and an ETA; short ones stay silent."""
from roctune.progress import Counted, counted


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
