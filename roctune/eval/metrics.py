"""Text metrics of a generated answer against its reference, computed as LLaMA-Factory computes them, so that the
numbers can be compared with its `predict_bleu-4` / `predict_rouge-l`: the texts are segmented with jieba (which
keeps English words whole and splits Chinese into words), ROUGE-1/2/L F1 from rouge-chinese on those words, and
BLEU-4 from nltk on the characters, smoothed with method 3. Every score is 0-100; exact match is 100 when the
answer equals the reference after trimming whitespace."""
from __future__ import annotations

import logging

from roctune.errors import EnvironmentProblem

NAMES = ("bleu4", "rouge1", "rouge2", "rougeL", "exact_match")
MISSING = "the generation metrics need jieba, rouge-chinese and nltk: pip install 'roctune[eval]'"


def check_available() -> None:
    """Refuse, with the fix, before any model loads when a metric package is missing."""
    import importlib.util

    for module in ("jieba", "rouge_chinese", "nltk"):
        if importlib.util.find_spec(module) is None:
            raise EnvironmentProblem(MISSING)


def _words(text: str) -> list[str]:
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its "building prefix dict" lines are not for the user
    return [w for w in jieba.lcut(text) if w.strip()]


def score(prediction: str, reference: str) -> dict[str, float]:
    """{bleu4, rouge1, rouge2, rougeL, exact_match} of one answer, each 0-100."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    hyp, ref = _words(prediction), _words(reference)
    rouge = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    if hyp and ref:
        try:
            rouge = {k: v["f"] for k, v in Rouge().get_scores(" ".join(hyp), " ".join(ref))[0].items()}
        except ValueError:  # rouge-chinese refuses a text left empty by its own cleaning (only punctuation)
            pass
    bleu = 0.0
    if prediction.strip() and reference.strip():
        bleu = sentence_bleu([list(reference)], list(prediction), smoothing_function=SmoothingFunction().method3)
    return {"bleu4": round(100 * float(bleu), 4), "rouge1": round(100 * rouge["rouge-1"], 4),
            "rouge2": round(100 * rouge["rouge-2"], 4), "rougeL": round(100 * rouge["rouge-l"], 4),
            "exact_match": 100.0 if prediction.strip() == reference.strip() else 0.0}


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(sum(r[k] for r in rows) / len(rows), 4) if rows else 0.0 for k in NAMES}
