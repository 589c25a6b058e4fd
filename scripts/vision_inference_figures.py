"""Issue 48's inference figures on a tiny vision-language model, offline: the merge's logit difference (the merged
folder loaded in plain transformers against the adapter), the GGUF + mmproj export read back (image embeddings and
KL after the picture, by llama.cpp where its multimodal library is installed, else transformers with the mmproj's
tensors loaded back) and one answer from `roctune serve` through the official openai client with a data URL.

The model is the VLM matrix's tiny Idefics3 (SmolVLM's layout, tests/vision_models.py) with a random LoRA adapter on
its language model, vision tower and connector (the vision side is what llama.cpp's converter drops: its issue
14867). About a minute on two CPU cores:

    PYTHONPATH=$PWD python scripts/vision_inference_figures.py [--work DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", help="folder for the model, adapter and outputs (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="vision-inference-")
    os.makedirs(work, exist_ok=True)
    figures = {}
    t = time.monotonic()
    base, adapter = _model(work)
    figures["build_seconds"] = round(time.monotonic() - t, 1)
    figures.update(_merge(adapter, work))
    figures.update(_export(adapter, work))
    figures.update(_serve(base, adapter))
    print(json.dumps(figures, indent=1))
    return 0


def _model(work: str) -> tuple[str, str]:
    import vision_models

    from roctune.models import resolve_model

    base = vision_models.build("idefics3", os.path.join(work, "tiny-vlm"), resolve_model(None))
    adapter = vision_models.lora_adapter(base, os.path.join(work, "lora"), vision_models.BOTH_TARGETS)
    return base, adapter


def _merge(adapter: str, work: str) -> dict:
    """roctune merge, then the merged folder in plain transformers against the adapter on a picture."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from roctune.data.images import probe_image
    from roctune.merge import merge

    out = os.path.join(work, "merged")
    report = merge(adapter, out, overwrite=True, log=lambda *_: None)
    base = json.load(open(os.path.join(adapter, "adapter_config.json")))["base_model_name_or_path"]
    processor = AutoProcessor.from_pretrained(out)
    enc = processor(text=["<image>What is in this picture?"], images=[[probe_image()]], return_tensors="pt")
    merged = AutoModelForImageTextToText.from_pretrained(out).eval()
    tuned = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), adapter).eval()
    with torch.no_grad():
        diff = float((merged(**enc).logits - tuned(**enc).logits).abs().max())
    return {"merge_check_max_logit_diff": report["max_logit_diff"], "merged_vs_adapter_max_logit_diff": diff}


def _export(adapter: str, work: str) -> dict:
    from roctune.export import export

    report = export(adapter, os.path.join(work, "export"), quant="q8_0", name="tiny-vlm", overwrite=True,
                    log=lambda *_: None)
    return {"export_" + k: report[k] for k in ("gguf", "mmproj", "mmproj_tensors", "mmproj_read_back",
                                               "mmproj_check", "check", "seconds")}


def _serve(base: str, adapter: str) -> dict:
    import openai

    from roctune.data.images import data_url, probe_image
    from roctune.serve import ServerThread, Settings, build_engine, create_app

    engine = build_engine(base, [("tuned", adapter)], device="cpu", dtype="fp32", max_batch=4)
    engine.start()
    try:
        with ServerThread(create_app(engine, Settings())) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            content = [{"type": "image_url", "image_url": {"url": data_url(probe_image())}},
                       {"type": "text", "text": "What colours are these?"}]
            answer = client.chat.completions.create(model="tuned", messages=[{"role": "user", "content": content}],
                                                    max_tokens=8, temperature=0)
            refused = None
            try:
                client.chat.completions.create(model="tuned", max_tokens=2, messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}])
            except openai.BadRequestError as e:
                refused = f"{e.status_code}: {e.body['message']}"
    finally:
        engine.stop()
    return {"serve_answer": answer.choices[0].message.content, "serve_prompt_tokens": answer.usage.prompt_tokens,
            "serve_http_url_refused": refused}


if __name__ == "__main__":
    raise SystemExit(main())
