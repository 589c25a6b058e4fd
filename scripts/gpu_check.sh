#!/usr/bin/env bash
# One GPU check for a machine with an AMD (ROCm) or NVIDIA GPU, in a few minutes:
#   1. roctune doctor --selftest (numeric self-test of every attention kernel and 4-bit against float64)
#   2. a Qwen2.5-0.5B-shaped model built from a config (random weights, the bundled tokenizer, or the tokenizer
#      folder $TOKENIZER when set: a GPU machine without the bundled model's package)
#   3. LoRA and QLoRA training steps in bf16 with sdpa, eager and flash_attention_2 (when flash-attn is installed)
#   4. roctune bench: tokens/s and peak memory on that model
#   5. scripts/measure_memory.py --device cuda: measured peaks against roctune's memory estimator
#   6. roctune serve answering with two adapters
# Writes results.json and results.md (and a log per step) to the folder given as $1 (default ./gpu_check_out).
# Every step runs; the exit status is non-zero and the failing steps are named when any step breaks.
# Usage: scripts/gpu_check.sh [OUT_DIR]     (PY=/path/to/python to choose the interpreter;
#        GPU_CHECK_STEPS="model train-lora-sdpa serve" to run only those steps)
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${1:-./gpu_check_out}"
PY="${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
mkdir -p "$OUT/logs" || { echo "gpu_check: cannot create $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >"$OUT/logs/gpu.log" 2>&1; then
  echo "gpu_check: REFUSED: torch ($PY) sees no GPU, and this check is for GPU machines." >&2
  echo "gpu_check: run '$PY -m roctune doctor' for the cause (torch build, driver, groups), or" \
       "'$PY -m roctune doctor --selftest' to check the CPU path." >&2
  sed 's/^/gpu_check:   /' "$OUT/logs/gpu.log" | tail -3 >&2
  exit 2
fi

RT=("$PY" -m roctune)
MODEL="$OUT/model"
: >"$OUT/steps.tsv"
FAILED=()

step() {  # step NAME COMMAND...: run it, log it, record ok/fail and its time (only the named ones when
  local name="$1" start status  # GPU_CHECK_STEPS lists step names, e.g. "model train-lora-sdpa serve")
  shift
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " $GPU_CHECK_STEPS " != *" $name "* ]]; then return 0; fi
  start=$(date +%s)
  echo "== $name"
  if "$@" >"$OUT/logs/$name.log" 2>&1; then status=ok; else status=fail; FAILED+=("$name"); fi
  printf '%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - start))" >>"$OUT/steps.tsv"
  if [ "$status" = fail ]; then
    echo "!! $name FAILED (log: $OUT/logs/$name.log):" >&2
    tail -15 "$OUT/logs/$name.log" | sed 's/^/   /' >&2
  fi
}

build_model() {
  "$PY" - "$MODEL" <<'EOF'
import os
import sys
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from roctune.models import default_model_dir

# Qwen2.5-0.5B's shapes; random weights
cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  tie_word_embeddings=True, rms_norm_eps=1e-6)
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(os.environ.get("TOKENIZER") or default_model_dir()).save_pretrained(sys.argv[1])
print("model:", sys.argv[1])
EOF
}

train_run() {  # train_run METHOD ATTN: a few bf16 steps, then the loss must be finite
  local run="$OUT/runs/$1-$2"
  "${RT[@]}" train --model "$MODEL" --data examples/identity.jsonl --output "$run" --overwrite --method "$1" \
    --attn "$2" --dtype bf16 --device cuda --max-steps 4 --batch-size 2 --grad-accum 1 --max-length 256 &&
    "$PY" - "$run" <<'EOF'
import json, math, os, sys
rows = [json.loads(line) for line in open(os.path.join(sys.argv[1], "metrics.jsonl")) if line.strip()]
losses = [r["loss"] for r in rows if "loss" in r]
print("losses:", losses)
sys.exit(0 if losses and all(math.isfinite(x) for x in losses) else "loss missing or not finite")
EOF
}

memory_check() {
  "$PY" scripts/measure_memory.py --device cuda --model-dir "$MODEL" --runs 2x512:bf16,4x512:bf16:ckpt \
    --out "$OUT/memory_measured_gpu.json" &&
    "$PY" - "$OUT/memory_measured_gpu.json" <<'EOF'
import json, sys
sys.path.insert(0, "tests")
from test_memory import _estimate_row  # the estimator call the memory tests check tables with

table = json.load(open(sys.argv[1]))
errors = []
for r in table["runs"]:
    est = _estimate_row(table, r).peak_tensor_bytes
    errors.append({"run": f"{r['batch_size']}x{r['max_length']}{' ckpt' if r['grad_checkpointing'] else ''}",
                   "measured": r["peak_bytes"], "estimated": est, "error": (est - r["peak_bytes"]) / r["peak_bytes"]})
table["estimator"] = errors
json.dump(table, open(sys.argv[1], "w"), indent=2)
print(json.dumps(errors, indent=2))
sys.exit(0 if all(abs(e["error"]) <= 0.15 for e in errors) else "estimator off by more than 15%")
EOF
}

serve_check() {
  local port=$((20000 + RANDOM % 20000)) pid rc
  "${RT[@]}" serve --model "$MODEL" --adapter "a=$OUT/runs/lora-sdpa" --adapter "b=$OUT/runs/qlora-sdpa" \
    --port "$port" --device cuda --log-level warning >"$OUT/logs/serve-server.log" 2>&1 &
  pid=$!
  "$PY" - "$port" "$pid" <<'EOF'
import json, os, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(240):
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except OSError:
        if not os.path.exists(f"/proc/{sys.argv[2]}"):  # the server died: say so now, not after the wait
            sys.exit("the server exited before it served (see serve-server.log)")
        time.sleep(0.5)
else:
    sys.exit("server did not come up in 120 s (see serve-server.log)")
for name in ("a", "b"):
    body = json.dumps({"model": name, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Who are you?"}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req, timeout=120))
    print(name, "->", repr(answer["choices"][0]["message"]["content"]))
EOF
  rc=$?
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return $rc
}

ATTNS=(sdpa eager)
"$PY" -c 'import flash_attn' 2>/dev/null && ATTNS+=(flash_attention_2)

selftest() { "${RT[@]}" doctor --selftest --json --no-tools >"$OUT/selftest.json"; }

step selftest selftest
step model build_model
for method in lora qlora; do
  for attn in "${ATTNS[@]}"; do
    step "train-$method-$attn" train_run "$method" "$attn"
  done
done
step bench "${RT[@]}" bench --model "$MODEL" --max-steps 6 --dtype bf16 --device cuda \
  --attn "$(IFS=,; echo "${ATTNS[*]}")" --json "$OUT/bench.json"
step memory memory_check
step serve serve_check

"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
steps = [dict(zip(("step", "status", "seconds"), line.rstrip("\n").split("\t"))) for line in open(f"{out}/steps.tsv")]
result = {"ok": all(s["status"] == "ok" for s in steps), "steps": steps}
try:
    import torch
    result["gpu"] = torch.cuda.get_device_name(0)
    result["torch"] = torch.__version__ + (f" (HIP {torch.version.hip})" if torch.version.hip else f" (CUDA {torch.version.cuda})")
except Exception as e:
    result["gpu"] = f"? ({e})"
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
if (selftest := load("selftest.json")):
    result["selftest"] = [f for f in selftest["findings"] if f["id"].startswith("selftest")]
if (bench := load("bench.json")):
    result["bench"] = [{"run": r["run"], "tokens_per_s": r["tokens_per_s"], "peak_memory_gib": r["peak_memory_bytes"] / 2**30}
                       for r in bench.get("runs", [])]
if (memory := load("memory_measured_gpu.json")):
    result["memory_estimator"] = memory.get("estimator")
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
md = [f"# gpu_check: {'PASS' if result['ok'] else 'FAIL'}", "", f"GPU: {result.get('gpu')}, torch {result.get('torch', '?')}", "",
      "| step | status | seconds |", "| --- | --- | --- |"]
md += [f"| {s['step']} | {s['status'].upper()} | {s['seconds']} |" for s in steps]
if result.get("selftest"):
    md += ["", "| self-test | level | message |", "| --- | --- | --- |"]
    md += [f"| {f['id']} | {f['level']} | {f['message']} |" for f in result["selftest"]]
if result.get("bench"):
    md += ["", "| bench run | tokens/s | peak memory (GiB) |", "| --- | --- | --- |"]
    md += [f"| {b['run']} | {b['tokens_per_s']:,.0f} | {b['peak_memory_gib']:.2f} |" for b in result["bench"]]
if result.get("memory_estimator"):
    md += ["", "| memory run | measured (GiB) | estimated (GiB) | error |", "| --- | --- | --- | --- |"]
    md += [f"| {e['run']} | {e['measured'] / 2**30:.2f} | {e['estimated'] / 2**30:.2f} | {100 * e['error']:+.1f}% |"
           for e in result["memory_estimator"]]
open(f"{out}/results.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check: FAILED steps: ${FAILED[*]} (logs in $OUT/logs)" >&2
  exit 1
fi
echo "gpu_check: all steps passed; results in $OUT/results.json and $OUT/results.md"
