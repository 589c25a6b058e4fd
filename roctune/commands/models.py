"""`roctune models`: the models to start from (`list`) and their download (`pull ID`) into $ROCTUNE_HOME/models,
from the Hugging Face hub (HF_ENDPOINT=https://hf-mirror.com for its mirror) or ModelScope (ROCTUNE_HUB=modelscope,
or an id like modelscope:Qwen/Qwen2.5-0.5B-Instruct). A pulled id then works offline: roctune train --model ID.
`build-vlm` assembles a vision-language model from a text model and a fresh vision tower (roctune.vision.build)."""
from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("models", help="list the models to start from; download one", description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the model list: id, size, licence, downloaded or not, folder",
                       description="The models roctune has a family spec for, the tutorials' Qwen2.5 first, and "
                                   "every other model pulled into $ROCTUNE_HOME/models.").set_defaults(func=run_list)
    pull = actions.add_parser("pull", help="download a model (resumable) and print its folder",
                              description="Download a hub id's safetensors, config and tokenizer files into "
                                          "$ROCTUNE_HOME/models/<org>--<name>; a second pull completes a stopped one. "
                                          "ROCTUNE_HUB_TIMEOUT (default 30 s) limits each connection and answer, "
                                          "ROCTUNE_HUB_STALL (default 60 s) a transfer that stalls.")
    pull.add_argument("id", metavar="ID", help="hub id, e.g. Qwen/Qwen2.5-0.5B-Instruct, or modelscope:ORG/NAME")
    pull.add_argument("--trust-remote-code", action="store_true",
                      help="also download the repository's own code (*.py) for a model that needs it")
    pull.set_defaults(func=run_pull)
    build = actions.add_parser("build-vlm", help="assemble a vision-language model from a text model and a fresh "
                               "vision tower", description="Join a text model (--text) and a freshly initialised "
                               "vision encoder (--vision CONFIG.json; default a small SigLIP-shaped tower) with a "
                               "projector, in SmolVLM's layout: a model folder that `roctune train --model DIR "
                               "--train-vision-tower --train-projector` teaches to see.")
    build.add_argument("--output", required=True, metavar="DIR", help="the new model folder (must not exist yet)")
    build.add_argument("--text", metavar="MODEL", help="the text model (default: the bundled SmolLM2-135M-Instruct)")
    build.add_argument("--vision", metavar="CONFIG.json", help="the vision tower's shape: a JSON object of "
                       "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, image_size, "
                       "patch_size, scale_factor (default: 192 wide, 4 layers, 32x32-pixel tiles in 8-pixel "
                       "patches, 4 tokens per tile; a picture is 2x2 tiles and the whole picture, 20 tokens)")
    build.add_argument("--seed", type=int, default=0, help="seed of the fresh tower and projector (default 0)")
    build.set_defaults(func=run_build_vlm)


def run_list(args) -> int:
    from roctune.hub import listing

    rows = [("id", "size", "licence", "downloaded", "folder")]
    for model_id, entry, folder in listing():
        size = f"{entry.size} (~{entry.download_gb:g} GB)" if entry else "-"
        licence = (entry.licence + (", gated" if entry.gated else "")) if entry else "-"
        rows.append((model_id, size, licence, "yes" if folder else "no", folder or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    print("\nroctune models pull ID downloads one (HF_ENDPOINT=https://hf-mirror.com or ROCTUNE_HUB=modelscope "
          "where huggingface.co is not reachable); then roctune train --model ID")
    return 0


def run_pull(args) -> int:
    from roctune.hub import pull, terminal_progress
    from roctune.hub.store import pulled_dir

    before = pulled_dir(args.id)
    with terminal_progress() as progress:
        folder = pull(args.id, progress=progress, trust_remote_code=args.trust_remote_code)
    print(f"{args.id}: {'already downloaded in' if before else 'downloaded to'} {folder}")
    print(f"train on it with: roctune train --model {args.id}", file=sys.stderr)
    return 0


def run_build_vlm(args) -> int:
    from roctune.vision.build import build_vlm

    built = build_vlm(args.output, args.text, args.vision, args.seed, log=lambda line: print(line, file=sys.stderr))
    print(built["output"])
    print(f"train it on image data with: roctune train --model {built['output']} --data FILE "
          "--train-vision-tower --train-projector", file=sys.stderr)
    return 0
