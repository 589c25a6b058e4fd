"""`roctune merge`: merge a LoRA adapter into its base model and save a plain transformers model."""
from __future__ import annotations

from roctune.hardware.choices import WEIGHT_DTYPES


def register(sub) -> None:
    p = sub.add_parser("merge", help="merge an adapter into its base model", description=__doc__)
    p.add_argument("--adapter", required=True, metavar="DIR", help="run directory from roctune train")
    p.add_argument("--output", required=True, metavar="DIR", help="where to save the merged model")
    p.add_argument("--dtype", choices=WEIGHT_DTYPES, default="fp32", help="dtype of the merged weights")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output")
    p.set_defaults(func=run)


def run(args) -> int:
    from roctune.merge import merge

    merge(args.adapter, args.output, dtype=args.dtype, overwrite=args.overwrite)
    return 0
