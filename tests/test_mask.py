"""Label masks: exact supervised positions for every record format, and the same prompt rendering as inference."""
import pytest

from roctune.data.formats import to_messages
from roctune.data.render import render_prompt, tokenize_conversation

RECORDS = {
    "alpaca": {"instruction": "Name a fruit.", "input": "", "output": "A pear."},
    "alpaca_input_system_history": {"system": "Be brief.", "instruction": "Add them:", "input": "2 and 3",
                                    "output": "5.", "history": [["Hi", "Hello!"]]},
    "messages": {"messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A pear."}]},
    "sharegpt": {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                                   {"from": "human", "value": "Add 2 and 3"}, {"from": "gpt", "value": "5."}]},
    "prompt_completion": {"prompt": "Name a fruit.", "completion": "A pear."},
}


def spans(labels):
    """[start, end) ranges of supervised positions."""
    out, start = [], None
    for i, x in enumerate(labels + [-100]):
        if x != -100 and start is None:
            start = i
        if x == -100 and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_exact_supervised_positions(tokenizer, fmt):
    msgs = to_messages(RECORDS[fmt], "rec")
    ids, labels = tokenize_conversation(tokenizer, msgs)
    assert len(ids) == len(labels)
    answers = [m["content"] for m in msgs if m["role"] == "assistant"]
    got = spans(labels)
    assert len(got) == len(answers)
    for (s, e), (i, answer) in zip(got, enumerate(answers)):
        assert labels[s:e] == ids[s:e]
        # each span is exactly the answer followed by the template's end-of-turn token (and its newline)
        assert tokenizer.decode(ids[s:e]) == answer + "<|im_end|>\n"
        # everything before the span is the prompt inference would render for this turn
        turn = [k for k, m in enumerate(msgs) if m["role"] == "assistant"][i]
        prompt_ids = tokenizer(render_prompt(tokenizer, msgs[:turn]), add_special_tokens=False)["input_ids"]
        assert ids[:s] == prompt_ids
    # no system/user token is trained
    assert sum(1 for x in labels if x != -100) == sum(e - s for s, e in got)


def test_alpaca_fields_reach_the_prompt():
    msgs = to_messages(RECORDS["alpaca_input_system_history"], "rec")
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1:3] == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert msgs[3] == {"role": "user", "content": "Add them:\n\n2 and 3"}


def test_truncation_keeps_prefix(tokenizer):
    msgs = to_messages(RECORDS["alpaca"], "rec")
    ids, labels = tokenize_conversation(tokenizer, msgs)
    ids2, labels2 = tokenize_conversation(tokenizer, msgs, max_length=len(ids) - 2)
    assert ids2 == ids[:-2] and labels2 == labels[:-2]


def test_packed_and_padded_batches_count_the_same_targets(tokenizer):
    from roctune.data.render import Tokenized
    from roctune.training.batching import collate

    exs = []
    for fmt in sorted(RECORDS):
        ids, labels = tokenize_conversation(tokenizer, to_messages(RECORDS[fmt], "r"))
        exs.append(Tokenized(ids, labels, fmt))
    padded = collate(exs, tokenizer.pad_token_id, packed=False, device="cpu")
    packed = collate(exs, tokenizer.pad_token_id, packed=True, device="cpu")
    n_p = int((padded.labels[:, 1:] != -100).sum())
    n_k = int((packed.labels[:, 1:] != -100).sum())
    assert n_p == n_k == padded.n_supervised == packed.n_supervised
    assert packed.input_ids.shape[1] == sum(len(e.input_ids) for e in exs)
    # position ids restart at each example so attention never crosses examples
    assert int((packed.position_ids[0] == 0).sum()) == len(exs)
