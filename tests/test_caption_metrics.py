"""COCO caption metrics (pycocoevalcap through vlhub.evaluation) against values worked out by hand."""

import math
import shutil

import pytest

from vlhub import evaluation
from vlhub.evaluation import caption_scores

pytest.importorskip("pycocoevalcap")
pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="the COCO caption metrics need Java")
FAST = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr")  # all but METEOR (~20 s to start)


def test_bleu_and_rouge_on_a_prefix_of_the_reference():
    # "a man rides a horse" against "A man rides a horse on the beach." (the PTB tokenizer lowercases and drops ".")
    scores = caption_scores(["a man rides a horse"], [["A man rides a horse on the beach."]], metrics=FAST)
    # every n-gram precision is 1; brevity penalty exp(1 - 8/5)
    for n in range(1, 5):
        assert scores[f"Bleu_{n}"] == pytest.approx(math.exp(1 - 8 / 5), abs=1e-6)
    # ROUGE-L: LCS 5, P = 5/5, R = 5/8, F_beta with beta = 1.2
    precision, recall, beta = 1.0, 5 / 8, 1.2
    assert scores["ROUGE_L"] == pytest.approx(
        (1 + beta**2) * precision * recall / (recall + beta**2 * precision), abs=1e-6
    )
    assert "METEOR" not in scores


def test_cider_d_uses_corpus_document_frequencies():
    # Two images, each caption equal to its single reference. Every n-gram occurs in one image's references:
    # idf = log(2) - log(1), the same for every n-gram, so each n-gram order with n-grams has cosine 1, and the
    # 3-/4-gram orders of 2-word captions have none (0). CIDEr-D = 10 * mean over n of the cosines = 10 * 2/4 = 5.
    scores = caption_scores(["dog cat", "red blue"], [["dog cat"], ["red blue"]], metrics=["CIDEr"])
    assert scores == {"CIDEr": pytest.approx(5.0, abs=1e-9), "num_images": 2}
    # With a single image every document frequency equals the corpus size: idf = 0 and CIDEr-D is 0.
    assert caption_scores(["dog cat"], [["dog cat"]], metrics=["CIDEr"])["CIDEr"] == 0.0


def test_disjoint_and_empty_captions_score_zero():
    scores = caption_scores(["zebra giraffe", ""], [["a dog runs"], ["a cat sits"]], metrics=FAST)
    assert scores["Bleu_1"] == pytest.approx(0.0, abs=1e-6)
    assert scores["ROUGE_L"] == 0.0 and scores["CIDEr"] == 0.0


def test_the_chosen_metrics_through_the_evaluate_module():
    """The evaluate module's `metrics` option, without METEOR (whose Java start costs ~15 s; the test below, slow,
    runs every metric)."""
    result = evaluation.load("coco_caption").compute(
        predictions=["a dog runs on the grass"],
        references=[["A dog runs on the grass.", "a brown dog"]],
        metrics=["Bleu_4", "ROUGE_L", "CIDEr"],
    )
    # an exact match: ROUGE-L 1, BLEU-4 1 (every precision 1, the closest reference length equal); one image: idf 0
    assert result == {
        "Bleu_4": pytest.approx(1.0, abs=1e-6),
        "ROUGE_L": pytest.approx(1.0),
        "CIDEr": 0.0,
        "num_images": 1,
    }


@pytest.mark.slow
def test_all_metrics_through_the_evaluate_module():
    metric = evaluation.load("coco_caption")
    result = metric.compute(
        predictions=["a dog runs on the grass"], references=[["A dog runs on the grass.", "a brown dog"]]
    )
    # an exact match: METEOR 1.5 gives a perfect match 1 (no fragmentation), ROUGE-L 1, every BLEU precision 1 with
    # the closest reference length equal (no brevity penalty)
    assert result["METEOR"] == pytest.approx(1.0) and result["ROUGE_L"] == pytest.approx(1.0)
    assert all(result[f"Bleu_{n}"] == pytest.approx(1.0, abs=1e-6) for n in range(1, 5))
    assert result["CIDEr"] == 0.0 and result["num_images"] == 1  # one image: idf 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="2 captions but references for 1"):
        caption_scores(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="non-empty list"):
        caption_scores(["a"], [[]])
    with pytest.raises(ValueError, match="no captions"):
        caption_scores([], [])
    with pytest.raises(ValueError, match="subset of"):
        caption_scores(["a"], [["a"]], metrics=["SPICE"])


def test_missing_java_is_a_clear_error(monkeypatch):
    import vlhub.evaluation.captions as captions

    monkeypatch.setattr(captions.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no `java` executable is on PATH"):
        caption_scores(["a dog"], [["a dog"]], metrics=["CIDEr"])


def test_one_tokenizer_run_scores_as_the_coco_evaluation_with_two():
    """References and captions share one PTB tokenizer run; the COCO evaluation tokenizes each set on its own.
    Texts that end in abbreviations, quotes and brackets (where a line could lean on the next) score the same."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    predictions = ['a man says "hello', "dogs (two of them", "mr.", "the U.S. flag etc.", "it's a cat's toy ..."]
    references = [
        ['A man says "hello"', "someone talks to mr."],
        ["two dogs (brown) play", "dogs run etc."],
        ["Mr. Smith waves", "a man... waving 'hi"],
        ["a u.s. flag flies", "flag of the U.S."],
        ["a cat's toy", "it is a toy -- for cats"],
    ]
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(references)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(predictions)})
    want = {f"Bleu_{n + 1}": v for n, v in enumerate(Bleu(4).compute_score(gts, res, verbose=0)[0])}
    want["ROUGE_L"] = Rouge().compute_score(gts, res)[0]
    want["CIDEr"] = Cider().compute_score(gts, res)[0]
    got = caption_scores(predictions, references, metrics=FAST)
    assert {metric: got[metric] for metric in FAST} == pytest.approx(want, abs=1e-12)
