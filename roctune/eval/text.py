"""`roctune eval` on a run whose stage row says it is evaluated on text (continued pretraining): the held-out text's
loss and perplexity under the base model and under the fine-tune. The text is read and packed exactly as training
packs its eval data (roctune.data.text: blocks of the run's --max-length, EOS between documents, the remainder
dropped) and scored with training's own loss (`scoring.losses`), so the tuned loss on the run's --eval-data equals
the eval_loss it logged. Pretraining text has no reference answers, so there is nothing to generate: no BLEU/ROUGE."""
from __future__ import annotations

import gc
import math

from roctune import rundir


def prepare(data: list[str], run: "rundir.Run", max_length: int | None) -> tuple[list, int]:
    """The documents (checked before a model loads) and the block length (default: the run's --max-length)."""
    from roctune.data.text import load_documents

    docs = load_documents(data)
    return docs, max_length or run.count("max_length", 512)


def evaluate(run: "rundir.Run", docs: list, max_length: int, say, model: str | None = None, **kw) -> dict:
    """{n (blocks), tokens, base: {loss, perplexity}, tuned: {loss, perplexity}}; `kw`: device, dtype,
    trust_remote_code as `load_for_inference` takes them."""
    from roctune.data.text import pack
    from roctune.eval.scoring import Case
    from roctune.generate import load_for_inference

    tuned = load_for_inference(run, model, **kw)
    blocks, _ = pack(tuned.tokenizer, docs, max_length)
    items = [Case(b.source, b, [], "") for b in blocks]
    say(f"scoring {len(items)} block(s) of {max_length} tokens with the fine-tuned model ({tuned.base_model} + "
        f"{run.path})")
    result = {"n": len(items), "tokens": len(items) * max_length, "tuned": _side(tuned, items, True, say)}
    say("scoring the same blocks with the base model")
    if tuned.adapter is not None:  # a PEFT adapter: the base is the same model with the adapter switched off
        base = tuned
    else:  # a freeze/full run saved a whole model: load its base separately
        name = model or run.base_model
        del tuned
        gc.collect()
        base = load_for_inference(None, name, **kw)
    result["base"] = _side(base, items, False, say)
    return result


def _side(loaded, items: list, use_adapter: bool, say) -> dict:
    from roctune.eval.scoring import losses

    sums = losses(loaded, items, use_adapter, say)
    loss = sum(t for t, _ in sums) / max(1, sum(n for _, n in sums))
    return {"loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 700.0)), 4)}
