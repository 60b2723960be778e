"""COCO caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D exactly as the COCO caption evaluation computes them.

This calls `pycocoevalcap` (the packaged COCO caption evaluation code) rather than re-implementing the metrics:
captions and references go through its PTB tokenizer (Stanford CoreNLP: lowercases, splits punctuation and removes
it), then each scorer runs on the corpus. CIDEr-D takes its document frequencies from the references of the corpus
being scored (`df="corpus"`), so a score depends on the whole set, as in the COCO evaluation. METEOR 1.5 and the PTB
tokenizer are Java programs: a `java` executable must be on PATH.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from typing import Sequence

__all__ = ["CAPTION_METRICS", "caption_scores"]

CAPTION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def _scorers():
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.meteor.meteor import Meteor
        from pycocoevalcap.rouge.rouge import Rouge
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    except ImportError as err:
        raise ImportError(
            "the caption metrics need pycocoevalcap (the COCO caption evaluation): pip install 'vlhub[captions]' "
            f"or pip install pycocoevalcap ({err})"
        ) from err
    return PTBTokenizer, Bleu, Meteor, Rouge, Cider


def caption_scores(
    predictions: Sequence[str], references: Sequence[Sequence[str]], metrics: Sequence[str] = CAPTION_METRICS
) -> dict[str, float]:
    """Corpus-level COCO caption metrics.

    Args:
        predictions: one generated caption per image.
        references: for each image, its reference captions (at least one).
        metrics: which of `CAPTION_METRICS` to compute (default all). METEOR is the slow one (its Java program loads
            a paraphrase table, ~20 s on a small machine); leave it out for a quick score (e.g. a CIDEr-D reward).
    Returns:
        The requested metrics among `{"Bleu_1", ..., "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}` (CIDEr is CIDEr-D, as
        the COCO evaluation's `Cider`) and `num_images`.
    """
    unknown = sorted(set(metrics) - set(CAPTION_METRICS))
    if unknown or not metrics:
        raise ValueError(f"metrics must be a non-empty subset of {CAPTION_METRICS}, got {list(metrics)}")
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} captions but references for {len(references)} images")
    if not predictions:
        raise ValueError("no captions to score")
    for i, (caption, refs) in enumerate(zip(predictions, references)):
        if not isinstance(caption, str):
            raise TypeError(f"predictions[{i}] must be a string, got {type(caption).__name__}")
        if isinstance(refs, str) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise ValueError(f"references[{i}] must be a non-empty list of non-empty captions, got {refs!r}")
    if shutil.which("java") is None:
        raise RuntimeError(
            "the COCO caption metrics run Java programs (the PTB tokenizer and METEOR 1.5) but no `java` executable "
            "is on PATH; install a Java runtime (e.g. apt-get install default-jre-headless)"
        )
    PTBTokenizer, Bleu, Meteor, Rouge, Cider = _scorers()
    tokenizer = PTBTokenizer()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # they print progress
        gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(references)})
        res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(predictions)})
        # An empty caption (e.g. a model that emits [SEP] first) tokenizes to "": score it, like COCO, as no words.
        res = {i: [c[0] if c else ""] for i, c in res.items()}
        scores = {}
        if any(m.startswith("Bleu_") for m in metrics):
            bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
            scores.update({f"Bleu_{n + 1}": float(v) for n, v in enumerate(bleu) if f"Bleu_{n + 1}" in metrics})
        if "METEOR" in metrics:
            meteor = Meteor()
            try:
                scores["METEOR"] = float(meteor.compute_score(gts, res)[0])
            finally:
                _close_meteor(meteor)
        if "ROUGE_L" in metrics:
            scores["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
        if "CIDEr" in metrics:
            scores["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    scores["num_images"] = len(predictions)
    return scores


def _close_meteor(meteor) -> None:
    """Stop METEOR's Java subprocess now (pycocoevalcap only does so when the object is garbage-collected)."""
    process = getattr(meteor, "meteor_p", None)
    if process is None:
        return
    with contextlib.suppress(Exception):
        lock = getattr(meteor, "lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            process.stdin.close()
            process.kill()
            process.wait()
