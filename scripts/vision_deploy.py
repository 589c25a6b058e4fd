"""The trained vision-language model of scripts/vision_learning.py (the assembled SmolLM2 + fresh tower, after
`--phase train`) through every way out of roctune, each answering the held-out pictures
(examples/vision_shapes_heldout.jsonl):

- chat:   `roctune chat --adapter RUN --image PICTURE`, one held-out picture per session, its question typed in;
- serve:  `roctune serve`, asked through the official `openai` client with each picture as a base64 data URL
          (plus one streamed answer, and an http:// URL refused with 400);
- merge:  `roctune merge`, the folder loaded with plain transformers (AutoModelForImageTextToText + AutoProcessor):
          its logits against the adapter's on every held-out conversation, and its greedy answers;
- export: `roctune export` (the language-model GGUF + llama.cpp's mmproj, checked by the export itself), then
          llama.cpp loads both files and picks the first answer token of every held-out question.

An answer counts when its first word is the expected one (for llama.cpp: when its first token is the expected
answer's first token, "Cir" of "Circle.").
Run it alone after the learning script (`flock /tmp/cpu.lock`):

    .venv/bin/python scripts/vision_learning.py --work /tmp/vlearn     # builds and trains /tmp/vlearn/{vlm,run}
    .venv/bin/python scripts/vision_deploy.py --work /tmp/vlearn [--only chat,serve,merge,export]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
HELDOUT = os.path.join(REPO, "examples", "vision_shapes_heldout.jsonl")
ENV = {**os.environ, "PYTHONPATH": REPO}

from vision_learning import first_word  # noqa: E402  (the learning script's scoring)


def roctune(*args: str, stdin: str | None = None) -> str:
    cmd = [sys.executable, "-m", "roctune", *args]
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=REPO, env=ENV)
    if done.returncode:
        sys.exit(f"roctune {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def heldout() -> list[dict]:
    with open(HELDOUT, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def parts(row: dict) -> tuple[str, str, str]:
    """(data URL, question, expected answer) of a held-out row."""
    content = row["messages"][0]["content"]
    return content[0]["image_url"]["url"], content[1]["text"], row["messages"][1]["content"]


def picture(url: str):
    """A held-out data URL as the RGB picture training saw (roctune's image border: checked, then loaded)."""
    from roctune.data.images import load, read_data_url

    return load(read_data_url(url, "held-out picture"))


def tally(rows: list[dict], said: list[str]) -> str:
    hits = sum(first_word(s) == first_word(parts(r)[2]) for r, s in zip(rows, said))
    return f"{hits}/{len(rows)}"


def by_chat(work: str, rows: list[dict]) -> dict:
    """One `roctune chat --image` session per picture (the first N held-out ones): the question typed in."""
    import base64

    said = []
    for i, row in enumerate(rows):
        url, question, _ = parts(row)
        picture = os.path.join(work, f"heldout-{i}.png")
        with open(picture, "wb") as f:
            f.write(base64.b64decode(url.split(",", 1)[1]))
        out = roctune("chat", "--adapter", os.path.join(work, "run"), "--image", picture, "--max-new-tokens", "6",
                      stdin=f"{question}\n/quit\n")
        said.append(next((line.split(">", 1)[1].strip() for line in out.splitlines()
                          if line.startswith("assistant>")), out.strip()[-40:]))
    return {"right": tally(rows, said), "answers": said}


def by_serve(work: str, rows: list[dict], port: int = 8791) -> dict:
    """`roctune serve` asked with the official openai client, each picture a data URL."""
    from openai import BadRequestError, OpenAI

    server = subprocess.Popen([sys.executable, "-m", "roctune", "serve", "--adapter",
                               f"shapes={os.path.join(work, 'run')}", "--port", str(port)], cwd=REPO, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        for _ in range(180):
            try:
                client.models.list()
                break
            except Exception:  # not up yet
                time.sleep(1)
        ask = lambda url, q, **kw: client.chat.completions.create(  # noqa: E731
            model="shapes", max_tokens=6, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": q}]}], **kw)
        said = [ask(*parts(r)[:2]).choices[0].message.content for r in rows]
        streamed = "".join(c.choices[0].delta.content or "" for c in ask(*parts(rows[0])[:2], stream=True)
                           if c.choices)
        try:
            ask("http://example.com/shape.png", "What shape is drawn?")
            refused = "answered (not refused)"
        except BadRequestError as e:
            refused = f"{e.status_code}: {e.body.get('message', e.body) if isinstance(e.body, dict) else e.body}"
    finally:
        server.terminate()
        server.wait(60)
    return {"right": tally(rows, said), "answers": said, "streamed": streamed, "http_url": refused[:160]}


def by_merge(work: str, rows: list[dict]) -> dict:
    """`roctune merge`, then plain transformers: logits against base + adapter, and greedy answers."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    merged = os.path.join(work, "merged")
    if not os.path.isdir(merged):
        roctune("merge", "--adapter", os.path.join(work, "run"), "--output", merged)
    processor = AutoProcessor.from_pretrained(merged)
    model = AutoModelForImageTextToText.from_pretrained(merged).eval()
    adapter = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(os.path.join(work, "vlm")),
                                        os.path.join(work, "run")).eval()
    worst, said = 0.0, []
    with torch.no_grad():
        for row in rows:
            url, question, _ = parts(row)
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
            text = processor.apply_chat_template(messages, add_generation_prompt=True)
            enc = processor(text=[text], images=[[picture(url)]], return_tensors="pt")
            got, want = model(**enc).logits, adapter(**enc).logits
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
            ids = model.generate(**enc, max_new_tokens=4, do_sample=False)
            said.append(processor.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return {"right": tally(rows, said), "max_rel_logit_diff": f"{worst:.1e}", "answers": said}


def by_export(work: str, rows: list[dict]) -> dict:
    """`roctune export` (GGUF + mmproj, checked by the export), then llama.cpp's first answer token per question."""
    import numpy as np
    from transformers import AutoTokenizer

    from roctune.data.render import render_prompt
    from roctune.export import llamacpp, mtmd

    out = os.path.join(work, "export")
    if not os.path.isdir(out):
        roctune("export", "--adapter", os.path.join(work, "run"), "--output", out, "--name", "shapes-vlm")
    with open(os.path.join(out, "roctune_export.json"), encoding="utf-8") as f:
        report = json.load(f)
    files = {"gguf": os.path.join(out, report["gguf"]), "mmproj": os.path.join(out, report["mmproj"])}
    tok = AutoTokenizer.from_pretrained(os.path.join(work, "merged") if os.path.isdir(os.path.join(work, "merged"))
                                        else os.path.join(work, "vlm"))
    model = llamacpp.Model(files["gguf"])
    vision = mtmd.Vision(model, files["mmproj"])
    said, right = [], 0
    try:
        for row in rows:
            url, question, answer = parts(row)
            text = render_prompt(tok, [{"role": "user", "content": [{"type": "image", "image": None},
                                                                   {"type": "text", "text": question}]}])
            got = vision.run(text.replace("<image>", mtmd.marker()), [picture(url)])
            first = int(np.argmax(got["logits"][-1]))
            right += first == tok.encode(answer, add_special_tokens=False)[0]  # "Circle." is "Cir" "cle" "."
            said.append(tok.decode([first]))
    finally:
        vision.close()
        model.close()
    check = report.get("mmproj_check", {})
    return {"right": f"{right}/{len(rows)}", "files": sorted(os.listdir(out)), "mmproj_check": check,
            "language_model_check": report.get("check"), "answers": said}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="the learning script's folder (vlm/ and run/ in it)")
    p.add_argument("--only", default="chat,serve,merge,export")
    p.add_argument("--chat-pictures", type=int, default=12, help="chat sessions (one process each; default 12)")
    args = p.parse_args()
    rows = heldout()
    ways = {"chat": lambda: by_chat(args.work, rows[:args.chat_pictures]), "serve": lambda: by_serve(args.work, rows),
            "merge": lambda: by_merge(args.work, rows), "export": lambda: by_export(args.work, rows)}
    results = {}
    for name in args.only.split(","):
        start = time.time()
        results[name] = ways[name]()
        results[name]["seconds"] = round(time.time() - start)
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "answers"}), flush=True)
    with open(os.path.join(args.work, "deploy.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
