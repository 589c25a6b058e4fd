"""A SentencePiece vocabulary (Llama 2, Mistral 7B, Gemma, Phi-3 mini) written the way llama.cpp's "llama"
tokenizer reads it: every piece of the model's `tokenizer.model` with its score and type (or, for a folder with
only tokenizer.json - converted from a GGUF file, or shipped so - its SentencePiece-style BPE pieces, scores from the
merge order: json_pieces), then the tokens
added on top (tokenizer.json / tokenizer_config.json), special token ids, and whether a BOS and a space
prefix are added.

The `tokenizer.model` file is a SentencePiece ModelProto; it is parsed with the protobuf class the
`sentencepiece` package ships (`sentencepiece_model_pb2`), so piece types (unknown, control, user-defined,
unused, byte) are read as SentencePiece defines them, not guessed from the text. Facts about the layout
(ids past the model become unused `[PADn]` with score -10000, added tokens get score -1000, special added
tokens are control tokens and the others user-defined with their '▁' turned back into spaces, `tokenizer.ggml.pre`
is "default") were read from llama.cpp's convert_hf_to_gguf.py (`_create_vocab_sentencepiece`); the code is
roctune's own.

llama.cpp's "llama" tokenizer merges pieces by score, which is SentencePiece's BPE; a unigram model (Viterbi
over piece scores) is split differently (measured on a tiny unigram model: llama.cpp's ids differed from
transformers' on 38 of 51 short texts), so it is refused. Whether llama.cpp puts a space before the text
(`add_space_prefix`; llama.cpp does it at the start and after every special token) follows what the model's
transformers tokenizer does after a special token - chat prompts are text between special tokens - and the
export check then compares llama.cpp's tokens with transformers' on the rendered prompts. (transformers 5
rebuilds a Llama model's SentencePiece tokenizer with '▁' before the start of the text only; llama.cpp cannot
express that, so for such a tokenizer text with no special token before it - plain completion without BOS - gets
no leading space in llama.cpp.)
"""
from __future__ import annotations

import json
import os
import re

from roctune.errors import ConfigError, EnvironmentProblem

MODEL_FILE = "tokenizer.model"


def find_model(dirs) -> str | None:
    """The first `tokenizer.model` in `dirs` (the model folder, then where its tokenizer came from)."""
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, MODEL_FILE)):
            return os.path.join(d, MODEL_FILE)
    return None


def read_proto(path: str):
    """The ModelProto of a SentencePiece model file; one line when it is not one or the package is missing."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError:
        raise EnvironmentProblem(f"{path}: a SentencePiece vocabulary needs the sentencepiece package: "
                                 "pip install 'roctune[gguf]'") from None
    proto = pb.ModelProto()
    try:
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and OSError alike
        raise ConfigError(f"{path}: not a readable SentencePiece model ({type(e).__name__}); "
                          "replace it with the base model's tokenizer.model") from None
    if not proto.pieces:
        raise ConfigError(f"{path}: a SentencePiece model without pieces; replace it with the base model's")
    if proto.trainer_spec.model_type != pb.TrainerSpec.BPE:
        kind = pb.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()
        raise ConfigError(f"{path}: a SentencePiece {kind} model; llama.cpp's SentencePiece tokenizer merges by "
                          "score (BPE) and would split text differently, so roctune export writes BPE models only")
    return proto


def proto_pieces(proto) -> list[tuple[str, float, int]]:
    """(piece, score, gguf token type) of every piece of a SentencePiece model."""
    import gguf

    from sentencepiece import sentencepiece_model_pb2 as pb

    T, kind = gguf.TokenType, pb.ModelProto.SentencePiece
    types_of = {kind.NORMAL: T.NORMAL, kind.UNKNOWN: T.UNKNOWN, kind.CONTROL: T.CONTROL,
                kind.USER_DEFINED: T.USER_DEFINED, kind.UNUSED: T.UNUSED, kind.BYTE: T.BYTE}
    return [(p.piece, p.score, types_of[p.type]) for p in proto.pieces]


def json_pieces(tokenizer) -> list[tuple[str, float, int]] | None:
    """(piece, score, gguf token type) for a SentencePiece BPE vocabulary kept only as tokenizer.json (a folder
    converted from GGUF, or shipped without tokenizer.model): a BPE model with byte fallback and '▁' for spaces,
    as transformers converts SentencePiece models. None for any other tokenizer.

    tokenizer.json has no piece scores; llama.cpp's SentencePiece tokenizer merges the adjacent pair whose result
    has the highest score, transformers the pair with the lowest merge rank, so each piece's score is minus the rank
    of the first merge that makes it: both then merge in the same order. Pieces no merge makes (single characters,
    bytes) are never a merge's result, so their score is not used; 0 as SentencePiece gives its own."""
    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = json.loads(backend.to_str()).get("model", {})
    if model.get("type") != "BPE" or not model.get("byte_fallback") or not any("\u2581" in t for t in model["vocab"]):
        return None
    rank: dict[str, int] = {}
    for r, merge in enumerate(model.get("merges", [])):
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank.setdefault(a + b, r)
    T = gguf.TokenType
    pieces: list[tuple[str, float, int]] = [("", 0.0, T.UNUSED)] * (max(model["vocab"].values()) + 1)
    for piece, i in model["vocab"].items():
        kind = (T.UNKNOWN if piece == model.get("unk_token") else T.BYTE if re.fullmatch(r"<0x[0-9A-F]{2}>", piece)
                else T.NORMAL)
        pieces[i] = (piece, -float(rank[piece]) if piece in rank else 0.0, kind)
    return pieces


def vocab_lists(pieces, tokenizer, vocab_size: int):
    """(tokens, scores, types) for `vocab_size` ids: the model's pieces, then the tokenizer's added tokens."""
    import gguf

    T = gguf.TokenType
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores, types = [-10000.0] * vocab_size, [T.UNUSED] * vocab_size
    for i, (piece, score, kind) in enumerate(pieces[:vocab_size]):
        tokens[i], scores[i], types[i] = piece, score, kind
    for i, added in sorted(tokenizer.added_tokens_decoder.items()):
        if i >= vocab_size:
            raise ConfigError(f"{tokenizer.name_or_path}: added token {added.content!r} has id {i}, past the "
                              f"model's {vocab_size} embedding rows")
        if i < len(pieces) and pieces[i][0] == added.content:
            # the model's own piece (<s>, </s>, <unk>, a control or user-defined symbol): its type stays, but a
            # piece the tokenizer treats as special is a control token for llama.cpp too (as its converter does)
            if added.special and types[i] in (T.NORMAL, T.USER_DEFINED):
                types[i] = T.CONTROL
            elif types[i] == T.NORMAL:  # an added token is matched whole in text (tokenizer.json has no piece
                types[i] = T.USER_DEFINED  # types: Gemma's <start_of_turn> is user-defined in its tokenizer.model)
            continue
        tokens[i] = added.content if added.special else added.content.replace("\u2581", " ")
        scores[i], types[i] = -1000.0, T.CONTROL if added.special else T.USER_DEFINED
    return tokens, scores, types


def space_after_special(tokenizer) -> bool:
    """Whether the tokenizer puts '▁' before text that follows a special token (Llama 2's legacy tokenizers
    and Mistral's do, as llama.cpp does with add_space_prefix; Gemma's and non-legacy ones do not)."""
    special = tokenizer.eos_token or tokenizer.bos_token or tokenizer.unk_token
    pieces = tokenizer.tokenize(f"{special}x") if special else tokenizer.tokenize("x")
    after = pieces[1:] if special and pieces[:1] == [special] else pieces
    return bool(after) and after[0].startswith("\u2581")


def write(w, tokenizer, model_file: str | None, vocab_size: int) -> None:
    """The tokenizer keys of a SentencePiece vocabulary, from `model_file` or else the tokenizer's tokenizer.json
    (special ids and template are the caller's)."""
    pieces = proto_pieces(read_proto(model_file)) if model_file else json_pieces(tokenizer)
    tokens, scores, types = vocab_lists(pieces, tokenizer, vocab_size)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(space_after_special(tokenizer))
