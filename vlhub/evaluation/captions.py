"""COCO caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D exactly as the COCO caption evaluation computes them.

This calls `pycocoevalcap` (the packaged COCO caption evaluation code) rather than re-implementing the metrics:
captions and references go through its PTB tokenizer (Stanford CoreNLP: lowercases, splits punctuation and removes
it), then each scorer runs on the corpus. CIDEr-D takes its document frequencies from the references of the corpus
being scored (`df="corpus"`), so a score depends on the whole set, as in the COCO evaluation. METEOR 1.5 and the PTB
tokenizer are Java programs: a `java` executable must be on PATH.

`CiderD` is the per-caption CIDEr-D that self-critical training uses as its reward: pycocoevalcap's CIDEr-D scorer with
the document frequencies of a fixed reference corpus (the training captions), and `caption_words` (a Python stand-in
for the PTB tokenizer: no Java start per training step).
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import re
import shutil
from typing import Hashable, Mapping, Sequence

import numpy as np

__all__ = ["CAPTION_METRICS", "caption_scores", "caption_words", "CiderD"]

CAPTION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


@contextlib.contextmanager
def _needs_pycocoevalcap():
    try:
        yield
    except ImportError as err:
        raise ImportError(
            "the caption metrics need pycocoevalcap (the COCO caption evaluation): pip install 'vlhub[captions]' "
            f"or pip install pycocoevalcap ({err})"
        ) from err


def _scorers():
    with _needs_pycocoevalcap():
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.meteor.meteor import Meteor
        from pycocoevalcap.rouge.rouge import Rouge
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
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
        # One Java start for references and captions: the tokenizer reads a line per text, references first, so
        # they get the lines a tokenizer of the references alone would give them.
        texts = {("ref", i): [{"caption": r} for r in refs] for i, refs in enumerate(references)}
        texts.update({("caption", i): [{"caption": c}] for i, c in enumerate(predictions)})
        tokenized = tokenizer.tokenize(texts)
        gts = {i: words for (kind, i), words in tokenized.items() if kind == "ref"}
        # An empty caption (e.g. a model that emits [SEP] first) tokenizes to "": score it, like COCO, as no words.
        res = {i: [c[0] if c else ""] for (kind, i), c in tokenized.items() if kind == "caption"}
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


# ---------------------------------------------------------------------------------------------------- CIDEr-D reward
# What pycocoevalcap's PTB tokenizer removes after tokenizing (its PUNCTUATIONS), with the characters the Java
# tokenizer turns into those tokens (quotes into `` and '', round and curly brackets into -LRB- ... -RCB-).
_PTB_PUNCTUATION = frozenset(
    [
        "''",
        "'",
        "``",
        "`",
        "-lrb-",
        "-rrb-",
        "-lcb-",
        "-rcb-",
        ".",
        "?",
        "!",
        ",",
        ":",
        "-",
        "--",
        "...",
        ";",
        '"',
        "(",
        ")",
        "{",
        "}",
    ]
)
_NOT = re.compile(r"(\w)n't\b")
_TOKEN = re.compile(r"n't|'\w+|\d+(?:[.,]\d+)+|\w+(?:-\w+)*|\.\.\.|--|[^\w\s]")


def caption_words(caption: str) -> list[str]:
    """The words of a caption as the COCO evaluation's PTB tokenizer gives them, in Python: lowercased, clitics split
    ("don't" → "do n't", "man's" → "man 's"), hyphenated words and numbers kept whole, punctuation split off and
    removed. It agrees with the Java tokenizer on ordinary captions; the reported metrics still use the Java one."""
    return [t for t in _TOKEN.findall(_NOT.sub(r"\1 n't", caption.lower())) if t not in _PTB_PUNCTUATION]


class _DocumentFrequencies(dict):
    """n-gram → number of reference sets holding it; an unseen n-gram reads as 0 without being stored (the scorer
    looks up every candidate n-gram, and the corpus must not grow with every caption scored)."""

    def __missing__(self, key):
        return 0.0


@functools.cache
def _fixed_corpus_scorer():
    """pycocoevalcap's `CiderScorer` with the document frequencies and corpus size fixed in advance, instead of
    taken from the references being scored (as "CIDEr-D with the training set's document frequencies")."""
    with _needs_pycocoevalcap():
        from pycocoevalcap.cider.cider_scorer import CiderScorer, cook_refs, cook_test

    class FixedCorpusCiderScorer(CiderScorer):
        def __init__(self, document_frequency: _DocumentFrequencies, log_documents: float, n: int, sigma: float):
            super().__init__(n=n, sigma=sigma)
            self.document_frequency = document_frequency
            self._log_documents = log_documents

        @property
        def ref_len(self):  # compute_cider sets log(#images scored); the fixed corpus' size is kept instead
            return self._log_documents

        @ref_len.setter
        def ref_len(self, value):
            pass

    return FixedCorpusCiderScorer, cook_refs, cook_test


class CiderD:
    """CIDEr-D of each caption against its image's references, with the document frequencies of a fixed corpus.

    This is the COCO evaluation's CIDEr-D (pycocoevalcap's scorer: tf-idf n-gram vectors for n = 1..4, clipped
    cosine, Gaussian length penalty with sigma 6, times 10) computed per caption, as the reward of self-critical
    training: the idf of an n-gram is `log(#reference images) - log(max(1, #images whose references hold it))` over
    `references` (the training captions), so a caption's score does not depend on the others in its batch.

    Args:
        references: image key → its reference captions (at least one image, each with at least one caption).
        n, sigma: as pycocoevalcap (4, 6.0).
    Call: `scorer(captions, keys)` → `np.ndarray` `(len(captions),)`, caption `i` scored against
    `references[keys[i]]`.
    """

    def __init__(self, references: Mapping[Hashable, Sequence[str]], n: int = 4, sigma: float = 6.0) -> None:
        if not references:
            raise ValueError("CIDEr-D needs a reference corpus of at least one image")
        self._scorer_class, cook_refs, self._cook_test = _fixed_corpus_scorer()
        self.n, self.sigma = n, sigma
        self._references = {}
        frequencies = _DocumentFrequencies()
        for key, captions in references.items():
            if isinstance(captions, str) or not captions or not all(isinstance(c, str) and c.strip() for c in captions):
                raise ValueError(
                    f"the references of {key!r} must be a non-empty list of non-empty captions, got {captions!r}"
                )
            cooked = cook_refs([" ".join(caption_words(c)) for c in captions], n)
            self._references[key] = cooked
            for ngram in {ngram for reference in cooked for ngram in reference}:
                frequencies[ngram] += 1.0
        self.document_frequency = frequencies
        self.log_documents = math.log(float(len(self._references)))

    def __call__(self, captions: Sequence[str], keys: Sequence[Hashable]) -> np.ndarray:
        if len(captions) != len(keys):
            raise ValueError(f"got {len(captions)} captions but {len(keys)} image keys")
        scorer = self._scorer_class(self.document_frequency, self.log_documents, self.n, self.sigma)
        for caption, key in zip(captions, keys):
            if key not in self._references:
                raise KeyError(f"no reference captions for image {key!r} in the CIDEr-D corpus")
            scorer.crefs.append(self._references[key])
            scorer.ctest.append(self._cook_test(" ".join(caption_words(caption)), self.n))
        if not captions:
            return np.zeros(0)
        return np.asarray(scorer.compute_cider(), dtype=np.float64)
