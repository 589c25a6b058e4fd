"""Speed and memory of a LoRA step with images, roctune against transformers + PEFT on the same batches, and
`roctune estimate` against roctune's measured peak (issue 48).

The model is the one `roctune models build-vlm` assembles (the bundled SmolLM2-135M-Instruct and a fresh SigLIP-shaped
tower, SmolVLM's layout). Every example holds IMAGES pictures (64 x 64: 2 x 2 tiles and the whole picture, one token
span of 33 tokens each) and a question about them, all about the same length. Each run is its own child process (its
peak RSS is its alone), with the same examples in the same order (no length grouping), the same LoRA (r 8 on the
language model's q/k/v/o; with --train-vision the tower and projector trained whole beside it), AdamW at the same
learning rate:
- roctune: `roctune train` (recipes.train);
- baseline: transformers' Trainer + PEFT get_peft_model, batches of roctune's token ids and labels (the same tokens
  the processor makes, tests/test_vision.py) padded by a collator, pixels from the model's processor, the model's
  own forward and loss.
Tokens/s counts all tokens (image tokens included) over the steps after the second. Run it alone:

    flock /tmp/cpu.lock .venv/bin/python scripts/bench_vision.py [--steps 12] [--train-vision]
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
COLOURS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 70, 215), "yellow": (230, 200, 30)}
UNTIMED = 2  # the first two steps: allocator warm-up


def make_data(path: str, n: int, images: int, seed: int = 0) -> None:
    from PIL import Image

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            names = [rng.choice(list(COLOURS)) for _ in range(images)]
            parts = []
            for name in names:
                buf = io.BytesIO()
                Image.new("RGB", (64, 64), COLOURS[name]).save(buf, "PNG")
                parts.append({"type": "image_url", "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}})
            parts.append({"type": "text", "text": "Which colours are these pictures, in order?"})
            answer = ", ".join(names).capitalize() + "."
            f.write(json.dumps({"messages": [{"role": "user", "content": parts},
                                             {"role": "assistant", "content": answer}]}) + "\n")


def config(spec: dict, output: str):
    from roctune.config import TrainConfig

    return TrainConfig(data=[spec["data"]], output=output, model=spec["model"], max_steps=spec["steps"],
                       batch_size=spec["batch"], grad_accum=1, max_length=spec["max_length"], lora_r=8, lora_alpha=16,
                       lora_dropout=0.0, lr=2e-4, seed=0, device="cpu", overwrite=True, group_by_length=False,
                       train_vision_tower=spec["train_vision"], train_projector=spec["train_vision"],
                       data_cache=False)


def run_roctune(spec: dict) -> dict:
    from roctune import rundir
    from roctune.recipes import train

    with tempfile.TemporaryDirectory(prefix="bench-vision-") as out:
        train(config(spec, out), log=lambda s: print(s, file=sys.stderr), progress=False)
        rows = rundir.read_metrics(out)
    return {"step_times": [r["step_time_s"] for r in rows], "step_tokens": [r["tokens"] for r in rows],
            "losses": [r["loss"] for r in rows]}


def run_baseline(spec: dict) -> dict:
    """transformers Trainer + PEFT, fed roctune's examples in the order roctune trains them."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import Dataset, SequentialSampler
    from transformers import AutoModelForImageTextToText, Trainer, TrainerCallback, TrainingArguments

    from roctune.data.image_tokens import tokenize_image_records
    from roctune.data.records import load_records
    from roctune.training.batching import plan_steps
    from roctune.training.vision_batch import pixel_inputs
    from roctune.vision import load_image_text, lora_pattern, projector_modules, tower_modules, vision_row

    cfg = config(spec, "unused")
    it = load_image_text(spec["model"])
    examples, _ = tokenize_image_records(it, load_records(spec["data"]), spec["max_length"])
    steps, _ = plan_steps([len(e.input_ids) for e in examples], cfg)
    order = [i for step in steps for mb in step for i in mb]
    row = vision_row(spec["model"])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(spec["model"], dtype=torch.float32)
    targets = lora_pattern(model, row, ["q_proj", "k_proj", "v_proj", "o_proj"], tower=False)
    whole = tower_modules(model, row) + projector_modules(model, row) if spec["train_vision"] else None
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets,
                                             modules_to_save=whole))
    pad = it.tokenizer.pad_token_id

    class Ordered(Dataset):
        def __len__(self):
            return len(order)

        def __getitem__(self, k):
            return examples[order[k]]

    def collate(items):
        width = max(len(e.input_ids) for e in items)
        ids = torch.full((len(items), width), pad)
        labels = torch.full((len(items), width), -100)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for i, e in enumerate(items):
            n = len(e.input_ids)
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(e.input_ids), torch.tensor(e.labels), 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask,
                **pixel_inputs(it, [e.images for e in items])}

    class InOrder(Trainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    times, losses = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            times[-1] = time.perf_counter() - times[-1]

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory(prefix="bench-vision-base-") as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=spec["batch"],
                                 gradient_accumulation_steps=1, learning_rate=2e-4, max_steps=spec["steps"],
                                 lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                                 logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                                 remove_unused_columns=False, disable_tqdm=True)
        InOrder(model=model, args=args, train_dataset=Ordered(), data_collator=collate, callbacks=[Clock()]).train()
    per_step = [[i for mb in step for i in mb] for step in steps][:len(times)]
    return {"step_times": times, "step_tokens": [sum(len(examples[i].input_ids) for i in s) for s in per_step],
            "losses": losses}


def child(kind: str, spec: dict) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{kind} failed:\n" + "\n".join(proc.stderr.splitlines()[-20:]))


def summary(r: dict) -> dict:
    timed = range(UNTIMED, len(r["step_times"]))
    seconds = sum(r["step_times"][i] for i in timed)
    return {"tokens_per_s": round(sum(r["step_tokens"][i] for i in timed) / seconds, 1),
            "peak_rss_gib": round(r["peak"] / 2 ** 30, 3), "mean_loss": round(sum(r["losses"]) / len(r["losses"]), 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--train-vision", action="store_true", help="also --train-vision-tower --train-projector")
    p.add_argument("--work", help="folder for the assembled model (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-vision-")
    model, data = os.path.join(work, "vlm"), os.path.join(work, f"data{args.images}.jsonl")
    if not os.path.isdir(model):
        from roctune.vision.build import build_vlm

        build_vlm(model, log=lambda s: print(s, file=sys.stderr))
    make_data(data, args.steps * args.batch, args.images)
    from roctune.data.image_tokens import tokenize_image_records
    from roctune.data.records import load_records
    from roctune.vision import load_image_text

    items, _ = tokenize_image_records(load_image_text(model), load_records(data), 4096)
    longest = max(len(e.input_ids) for e in items)
    spec = {"model": model, "data": data, "steps": args.steps, "batch": args.batch, "max_length": longest,
            "train_vision": args.train_vision}
    ours, base = summary(child("roctune", spec)), summary(child("baseline", spec))
    from roctune.memory.plan import estimate_run

    est = estimate_run(model, config(spec, "unused"), device="cpu", images=args.images, vision_model=model)
    result = {"examples": f"{args.steps * args.batch} x {args.images} images, {min(len(e.input_ids) for e in items)}-"
                          f"{longest} tokens ({items[0].image_tokens} image tokens each)",
              "batch": args.batch, "train_vision": args.train_vision, "roctune": ours, "transformers_peft": base,
              "speedup": round(ours["tokens_per_s"] / base["tokens_per_s"], 3),
              "memory_ratio": round(ours["peak_rss_gib"] / base["peak_rss_gib"], 3),
              "estimate_gib": round(est.total_bytes / 2 ** 30, 3),
              "estimate_error": round(est.total_bytes / 2 ** 30 / ours["peak_rss_gib"] - 1, 3)}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        spec = json.loads(sys.argv[3])
        out = run_roctune(spec) if sys.argv[2] == "roctune" else run_baseline(spec)
        from roctune.hardware.accel import peak_memory_bytes

        out["peak"] = peak_memory_bytes("cpu")
        print("RESULT " + json.dumps(out))
        sys.exit(0)
    sys.exit(main())
