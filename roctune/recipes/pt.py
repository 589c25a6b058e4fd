"""Continued pretraining: learn raw text (a domain corpus, a company's documents) as the base model learned its own.

Data: .txt files (one document each), folders of them, or a `text` column (roctune.data.text reads them). The
documents are tokenized, each followed by EOS, concatenated and cut into blocks of exactly --max-length tokens;
the remainder shorter than a block is dropped, as HF's run_clm.py and LLaMA-Factory's pt stage do. Every token is
learned (labels = input ids), so the loss is the mean next-token cross-entropy over the blocks and exp(eval_loss)
is the held-out perplexity. No chat template is involved.

The step, batching, evaluation, checkpoints and resume are SFT's (`sft.fit_tokenized`): a block is a tokenized
example whose labels are all its tokens."""
from __future__ import annotations

from roctune.recipes import sft
from roctune.training import session


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    from roctune.data.text import pack

    setup, dist, tokenizer = session.start(cfg, base_model, say)
    session.phase(cfg, dist, "tokenizing")
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    # the blocks are not kept in the tokenized-data cache: the cache's key reads --data values as record files
    # (a folder of .txt files is not one), and packing plain text costs about what reading the cache would
    train_ex, eval_ex = session.tokenize_splits(pack, tokenizer, records, eval_records, cfg, say, "block")
    n_tokens = sum(len(e.input_ids) for e in train_ex)
    say(f"pt: {len(records)} document(s) packed into {len(train_ex)} training block(s) of {cfg.max_length} tokens "
        f"({n_tokens:,} tokens; the last partial block is dropped), {len(eval_ex)} eval block(s)")
    return sft.fit_tokenized(cfg, setup, dist, tokenizer, base_model, train_ex, eval_ex, say, progress)
