"""One forward and backward of a long example through roctune's sequence parallelism, run by tests/
test_sequence_parallel.py: under torchrun (every rank keeps its slice of the tokens, the gradients go through
DistributedDataParallel as in training) or alone (the reference). Writes the loss summed over the ranks, the LoRA
gradients and this rank's bytes saved for backward into OUT (rank 0 writes the loss and gradients).

usage: python tests/sp_worker.py MODEL_DIR LENGTH OUT_DIR"""
from __future__ import annotations

import json
import os
import sys


def example(length: int, vocab: int):
    """A long example: random tokens, the first fifth a prompt (not learned)."""
    import torch

    from roctune.data.render import Tokenized

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, vocab, (length,), generator=g).tolist()
    cut = length // 5
    return Tokenized(input_ids=ids, labels=[-100] * cut + ids[cut:], source="sp_worker")


def lora_model(model_dir: str):
    """The tiny model with a LoRA adapter whose B matrices are random too (so every gradient is non-zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from roctune.models import load_model

    torch.manual_seed(0)
    model = get_peft_model(load_model(model_dir, attn="sdpa"),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def saved_bytes(fn, model):
    """(fn(), bytes of the activations autograd saved for backward while fn ran: each storage once, the model's
    weights (saved by every linear layer, the same on every rank) left out)."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def main(model_dir: str, length: int, out_dir: str) -> None:
    import torch
    from safetensors.torch import save_file

    from roctune.training import distributed, sequence_parallel
    from roctune.training.batching import collate
    from roctune.training.losses import Head, token_loss_sum

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ctx = distributed.init("cpu", sequence_parallel=world)
    model = lora_model(model_dir)
    batch = collate([example(length, model.config.vocab_size)], 0, False, "cpu")
    if ctx.sp_size > 1:
        sequence_parallel.install(model, ctx.sp_group, ctx.sp_size, "sdpa")
        batch = sequence_parallel.shard(batch, ctx.sp_rank, ctx.sp_size, 0)

    class Step(torch.nn.Module):  # the loss inside DDP's forward, as roctune.training.loop runs it
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self):
            return token_loss_sum(self.inner, batch, Head())

    step = distributed.wrap_ddp(Step(model), ctx, "cpu") if ctx.enabled else Step(model)
    loss, nbytes = saved_bytes(step, model)
    (loss * world).backward()  # DDP averages the ranks' gradients; the loop scales the same way to get their sum
    total = distributed.sum_numbers(ctx, [float(loss.detach()), batch.n_supervised], "cpu")
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"loss_sum": total[0], "supervised": total[1], "saved_bytes": nbytes,
                   "local_tokens": int(batch.input_ids.shape[1])}, f)
    if ctx.is_main:
        save_file({n: p.grad.contiguous() for n, p in model.named_parameters() if p.requires_grad},
                  os.path.join(out_dir, "grads.safetensors"))
    distributed.shutdown(ctx)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
