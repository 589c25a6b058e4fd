"""A LoRA GGUF applied by llama.cpp to the GGUF file the base model came from (`--model FILE.gguf`), against the
merged model in transformers (fp32): mean KL divergence, same-top-token rate and greedy answers over the run's own
check conversations, first for the original file alone (what the adapter has to change), then with the adapter.
`roctune export --format lora-gguf` checks the adapter on an f16 GGUF of the base; this is the file users keep.

    python scripts/lora_on_original.py RUN ORIGINAL.gguf ADAPTER.gguf WORKDIR
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    from roctune.export import verify
    from roctune.merge import merge

    run, original, lora, work = sys.argv[1:5]
    merged = os.path.join(work, "merged")
    if not os.path.isdir(merged):
        merge(run, merged, log=lambda *_: None)
    ref, tok = verify._load_reference(merged)
    runs = verify.reference_runs(ref, tok, verify.check_conversations(run))
    for label, adapter in (("original file alone", None), ("original file + LoRA GGUF", lora)):
        f = verify.by_llama_cpp(original, runs, tok, lora=adapter, same_template=False)
        print(f"{label}: mean KL {f['mean_kl']:.4f} (99th percentile {f['kl_99']:.3f}), same top token "
              f"{100 * f['same_top']:.1f}% of {f['positions']} positions, greedy answers equal "
              f"{f['answers_equal']}/{len(f['answers'])}")
        for a in f["answers"]:
            print(f"   merged: {a['merged']!r}\n   gguf:   {a['gguf']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
