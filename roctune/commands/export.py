"""`roctune export`: a trained run as a GGUF file for llama.cpp and Ollama (merged, written without a compiler,
run in llama.cpp and compared with the merged model), or its LoRA adapter alone as a GGUF, with an Ollama Modelfile and a DEPLOY.md for llama.cpp, Ollama,
vLLM and SGLang."""
from __future__ import annotations

from roctune.export import ROWS, quants


def register(sub) -> None:
    p = sub.add_parser("export", help="export a run as GGUF (llama.cpp, Ollama) with a deploy recipe",
                       description=__doc__)
    p.add_argument("--adapter", required=True, metavar="DIR", help="run directory from roctune train")
    p.add_argument("--output", required=True, metavar="DIR", help="folder for the .gguf, Modelfile and DEPLOY.md")
    p.add_argument("--format", default=ROWS[0].name, metavar="FORMAT",
                   help=" or ".join(f"{f.name} ({f.help})" for f in ROWS))
    p.add_argument("--quant", metavar="TYPE", help=f"{quants.help_text()}; --format "
                   f"{', '.join(f.name for f in ROWS if f.quant)} only")
    p.add_argument("--embedding-type", default="auto", metavar="TYPE",
                   help="token embedding type in a llama.cpp quant: auto (q8_0 when the vocabulary is a large share "
                        "of the weights, else llama.cpp's choice), q8_0, q6_k, f16 or default (llama.cpp's choice)")
    p.add_argument("--output-type", default="auto", metavar="TYPE",
                   help="output layer type in a llama.cpp quant, as --embedding-type")
    p.add_argument("--name", metavar="NAME", help="model name for Ollama and the file (default: the run's folder)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip running the GGUF in llama.cpp (or reading it back) and comparing it")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --output")
    p.set_defaults(func=run)


def run(args) -> int:
    from roctune.errors import ConfigError
    from roctune.export import FORMATS, export

    if args.quant is not None and not args.quant.strip():  # `--quant ''` (an unset variable): said, not the default
        quants.check(args.quant)
    if args.quant is not None and args.format in FORMATS and not FORMATS[args.format].quant:  # said, not dropped
        takes = [f.name for f in ROWS if f.quant]
        raise ConfigError(f"--quant {args.quant}: --format {args.format} is written in f32 (llama.cpp applies it to a "
                          f"base GGUF of any type); drop --quant, or export the merged model: --format {takes[0]} "
                          f"--quant {args.quant}")
    quant = quants.DEFAULT if args.quant is None else args.quant
    export(args.adapter, args.output, quant=quant, name=args.name, fmt=args.format, verify=not args.no_verify,
           overwrite=args.overwrite, embedding_type=args.embedding_type, output_type=args.output_type)
    return 0
