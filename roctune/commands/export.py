"""`roctune export`: a trained run as a GGUF file for llama.cpp and Ollama (merged, written without a compiler,
read back and compared with the merged model), with an Ollama Modelfile and a DEPLOY.md for llama.cpp, Ollama,
vLLM and SGLang."""
from __future__ import annotations

def register(sub) -> None:
    p = sub.add_parser("export", help="export a run as GGUF (llama.cpp, Ollama) with a deploy recipe",
                       description=__doc__)
    p.add_argument("--adapter", required=True, metavar="DIR", help="run directory from roctune train")
    p.add_argument("--output", required=True, metavar="DIR", help="folder for the .gguf, Modelfile and DEPLOY.md")
    p.add_argument("--format", default="gguf", metavar="FORMAT", help="gguf (the only one so far)")
    p.add_argument("--quant", default="q8_0", metavar="TYPE",
                   help="f16, bf16, q8_0 (written by roctune); K-quants q4_k_m, q5_k_m, ... need llama-cpp-python")
    p.add_argument("--name", metavar="NAME", help="model name for Ollama and the file (default: the run's folder)")
    p.add_argument("--no-verify", action="store_true", help="skip reading the GGUF back and comparing it")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --output")
    p.set_defaults(func=run)


def run(args) -> int:
    from roctune.export import export

    export(args.adapter, args.output, quant=args.quant, name=args.name, fmt=args.format,
           verify=not args.no_verify, overwrite=args.overwrite)
    return 0
