"""What autograd keeps for backward in one roctune training micro-batch, grouped by the op that keeps it.

Loads the bundled model (or --model) with a fresh LoRA adapter (r8, alpha 16, dropout 0.05 on q/k/v/o, fp32, SDPA)
and runs one forward of roctune's loss on the two longest examples of --data, with a saved-tensor hook counting
every tensor storage autograd keeps (parameters excluded, each storage once). `--plain` shows plain peft and the
full cross-entropy path instead of roctune's (roctune.training.activations + the chunked output layer), for the
before/after table in roctune/training/activations.py. Then runs the backward and prints the process's peak RSS.

    .venv/bin/python scripts/activation_memory.py --data data.jsonl [--plain] [--max-length 512]
"""
from __future__ import annotations

import argparse
import collections
import resource


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from roctune.data.records import load_records
    from roctune.data.render import tokenize_records
    from roctune.models import load_tokenizer, resolve_model
    from roctune.training import losses
    from roctune.training import shortcuts
    from roctune.training.activations import slim
    from roctune.training.batching import collate

    base = resolve_model(args.model)
    tok = load_tokenizer(base)
    examples, _ = tokenize_records(tok, load_records(args.data), args.max_length)
    examples = sorted(examples, key=lambda e: -len(e.input_ids))[:2]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=0.05,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    plan = shortcuts.plan(model)
    if args.plain:
        losses._frozen_head = lambda model, head: None  # the log-softmax path, logits kept
    else:
        print(slim(model, plan.on, plan.family))
    model.train()
    batch = collate(examples, tok.pad_token_id, False, "cpu")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    by_shape: collections.Counter = collections.Counter()

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
            by_shape[(tuple(t.shape), str(t.dtype).replace("torch.", ""))] += seen[ptr]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = losses.token_loss_sum(model, batch, plan.head)
    print(f"micro-batch {list(batch.input_ids.shape)}, {int(batch.n_supervised)} supervised positions")
    print(f"kept for backward: {sum(seen.values()) / 2 ** 20:,.0f} MiB in {len(seen)} tensors")
    for (shape, dtype), n in by_shape.most_common(12):
        print(f"  {n / 2 ** 20:8.1f} MiB  {shape} {dtype}")
    loss.backward()
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20:.2f} GiB")


if __name__ == "__main__":
    main()
