"""Supervised fine-tuning: learn the assistant answers of conversations.

Every conversation is rendered with the model's chat template (roctune.data); labels are -100 on every prompt
token, so only the answers (with their end-of-turn token) are learned. The loss of a step is the mean token
cross-entropy over all its supervised tokens. A vision-language model's conversations carry images: its processor
tokenizes them (every image token labelled -100, never cut by --max-length: roctune.data.image_tokens) and builds
each batch's pixels (roctune.training.vision_batch); the step is the same. With --sequence-parallel each process of a sequence group
computes the loss of its slice of every batch's tokens (roctune.training.sequence_parallel); the slices' sums add
up to the batch's."""
from __future__ import annotations

from roctune.training import loop, sequence_parallel, session, vision_batch
from roctune.training.batching import collate, supervised_count
from roctune.training.losses import token_loss_sum


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    from functools import partial

    from roctune.data.render import RenderOptions, iter_tokenized, tokenize_records

    setup, dist, tokenizer = session.start(cfg, base_model, say)
    session.phase(cfg, dist, "tokenizing")
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    options = RenderOptions.from_config(cfg)
    if setup.vision is not None:  # images: tokenized by the model's processor, never cut (data.image_tokens)
        from roctune.data.image_tokens import tokenize_image_records

        tokenize = lambda tok, recs, n: tokenize_image_records(setup.vision, recs, n, options)  # noqa: E731
        train_ex, eval_ex = session.tokenize_splits(tokenize, tokenizer, records, eval_records, cfg, say, "example")
        session.say_images(train_ex, say)
    else:
        train_ex, eval_ex = session.tokenize_splits(partial(tokenize_records, options=options), tokenizer, records,
                                                    eval_records, cfg, say, "example",
                                                    ({"recipe": "sft", **vars(options)},
                                                     partial(iter_tokenized, options=options)))
    return fit_tokenized(cfg, setup, dist, tokenizer, base_model, train_ex, eval_ex, say, progress)


def fit_tokenized(cfg, setup, dist, tokenizer, base_model: str, train_ex: list, eval_ex: list, say,
                  progress: bool) -> dict:
    """Train on tokenized examples (ids + labels) with the SFT step: build the model, run the loop, save. Shared
    by the recipes whose examples are token sequences with labels (`pt` packs raw text into such blocks)."""
    n_tok = sum(len(e.input_ids) for e in train_ex)
    session.warn_memory(cfg, base_model, setup, say, sum(supervised_count(e.labels) for e in train_ex) / max(1, n_tok),
                        max((len(getattr(e, "images", ())) for e in train_ex), default=0))
    if dist.sp_size > 1:  # before the model loads
        sequence_parallel.check_kernel(setup.attn)
    session.phase(cfg, dist, "loading")
    model, plan = session.build_trainable(cfg, setup, base_model, say)
    if dist.sp_size > 1:
        how = sequence_parallel.install(model, dist.sp_group, dist.sp_size, setup.attn)
        if dist.is_main:
            say(f"sequence parallel attention: {how}")
    session.open_output(cfg, dist)

    pad_id = tokenizer.pad_token_id
    # the output layer only at supervised positions (FSDP needs the model's own forward to gather weights)
    head = plan.head if cfg.loss_on_supervised_only and not (cfg.fsdp and dist.enabled) else None
    collate_fn = collate if setup.vision is None else vision_batch.collator(model, setup.vision)

    def batch(items):
        b = collate_fn(items, pad_id, setup.packed, setup.device)
        return sequence_parallel.shard(b, dist.sp_rank, dist.sp_size, pad_id) if dist.sp_size > 1 else b

    def eval_sums(model, items):
        b = batch(items)  # n: this process's supervised tokens (a sequence group's add up to the batch's)
        return {"loss": float(token_loss_sum(model, b, head)), "n": b.n_supervised}

    task = loop.Task(
        items=train_ex, eval_items=eval_ex, lengths=[len(e.input_ids) for e in train_ex],
        loss_sum=lambda model, items: (token_loss_sum(model, batch(items), head), {}),
        weight=lambda e: supervised_count(e.labels), tokens=lambda e: len(e.input_ids), norm_name="supervised_tokens",
        eval_sums=eval_sums,
        eval_metrics=lambda s: {"eval_loss": round(s["loss"] / max(1, s["n"]), 6)})
    saved = tokenizer if setup.vision is None else setup.vision.processor  # a vision model's run: its processor
    model, summary = loop.fit(cfg, setup, model, task, dist, say, progress,
                              save=lambda m: session.save_final(cfg, m, saved, dist))
    return session.finish(cfg, model, saved, dist, summary, say)

