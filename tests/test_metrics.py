"""VQA accuracy and retrieval recall: the plain functions and the shipped `evaluate` modules (loaded offline).

Expected values are worked out by hand from the official rules (see each test)."""

import pytest

from vlhub import evaluation
from vlhub.evaluation import normalize_answer, retrieval_recall, vqa_accuracy_score


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("Two", "2"),  # number words become digits, case is folded
        ("a dog", "dog"),  # articles are dropped
        ("The Dog.", "dog"),  # a period not followed by a digit is deleted
        ("dont", "don't"),  # contractions get their apostrophe
        ("2.5", "2.5"),  # a period before a digit stays
        ("black/white", "black white"),  # a mark touching no space becomes a space
        ("yes !", "yes"),  # a mark touching a space is deleted
        ("1,000", "1000"),  # digit-comma-digit: marks are deleted
        ("  none\t", "0"),
        ("an apple", "apple"),
    ],
)
def test_answer_normalisation(raw, normalized):
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    "matches, expected",
    [
        # Ten leave-one-out subsets of nine annotators; a subset scores min(#matching / 3, 1).
        (0, 0.0),
        (1, 0.3),  # 1 subset without the match: 0; 9 subsets with it: 1/3  → 9/3 / 10
        (2, 0.6),  # 2 subsets: 1/3; 8 subsets: 2/3                          → (2/3 + 16/3) / 10
        (3, 0.9),  # 3 subsets: 2/3; 7 subsets: 1                            → (2 + 7) / 10
        (4, 1.0),  # every subset keeps at least 3 matches
        (10, 1.0),
    ],
)
def test_vqa_accuracy_leave_one_out(matches, expected):
    references = ["cat"] * matches + ["dog"] * (10 - matches)
    assert vqa_accuracy_score("cat", references) == pytest.approx(expected)


def test_vqa_accuracy_normalises_the_prediction():
    assert vqa_accuracy_score("Two", ["2"] * 10) == 1.0
    assert vqa_accuracy_score("a dog", ["dog"] * 2 + ["cat"] * 8) == pytest.approx(0.6)


def test_vqa_accuracy_reference_processing_follows_the_official_script():
    # The official script punctuation-processes references only when they differ from each other.
    assert vqa_accuracy_score("yes", ["yes."] * 10) == 0.0
    assert vqa_accuracy_score("yes", ["yes."] * 9 + ["no"]) == 1.0
    # References are never lower-cased (the official annotations already are).
    assert vqa_accuracy_score("yes", ["Yes"] * 10) == 0.0


def test_vqa_accuracy_rejects_bad_input():
    with pytest.raises(ValueError, match="annotator answers"):
        vqa_accuracy_score("yes", [])
    with pytest.raises(ValueError, match="annotator answers"):
        vqa_accuracy_score("yes", "yes")
    with pytest.raises(TypeError, match="string"):
        vqa_accuracy_score(3, ["3"] * 10)


def test_vqa_accuracy_evaluate_module_offline():
    metric = evaluation.load("vqa_accuracy")
    result = metric.compute(
        predictions=["Two", "a dog", "cat"],
        references=[["2"] * 10, ["dog"] * 2 + ["cat"] * 8, ["dog"] * 2 + ["cat"] * 8],
        answer_types=["number", "other", "other"],
    )
    # (1.0 + 0.6 + 1.0) / 3; the "other" questions average (0.6 + 1.0) / 2.
    assert result["accuracy"] == pytest.approx(2.6 / 3)
    assert result["accuracy_number"] == pytest.approx(1.0)
    assert result["accuracy_other"] == pytest.approx(0.8)


def test_vqa_accuracy_evaluate_module_accumulates_batches():
    metric = evaluation.load("vqa_accuracy")
    metric.add_batch(predictions=["cat"], references=[["cat"] * 3 + ["dog"] * 7])
    metric.add(prediction="dog", references=["cat"] * 10)
    assert metric.compute()["accuracy"] == pytest.approx(0.9 / 2)


def test_unknown_metric_names_the_shipped_ones():
    with pytest.raises(ValueError, match="vqa_accuracy"):
        evaluation.load("bleu")


def test_retrieval_recall_by_hand():
    # 4 texts × 3 images. Text ranks of their image: t0→i0 rank 0, t1→i0 rank 1, t2→i1 rank 2, t3→i2 rank 0.
    scores = [[0.9, 0.1, 0.2], [0.5, 0.7, 0.1], [0.8, 0.1, 0.3], [0.1, 0.2, 0.6]]
    targets = [0, 0, 1, 2]
    result = retrieval_recall(scores, targets, ks=(1, 2))
    assert result["text_to_image_recall@1"] == pytest.approx(2 / 4)
    assert result["text_to_image_recall@2"] == pytest.approx(3 / 4)
    # Image columns: i0 ranks texts t0(0.9) t2(0.8) t1(0.5) t3 → best own text t0 at rank 0.
    # i1: t1(0.7) t3(0.2) t0/t2(0.1, t0 first) → its text t2 at rank 3. i2: t3(0.6) first → rank 0.
    assert result["image_to_text_recall@1"] == pytest.approx(2 / 3)
    assert result["image_to_text_recall@2"] == pytest.approx(2 / 3)
    assert result["mean_recall"] == pytest.approx((2 / 4 + 3 / 4 + 2 / 3 + 2 / 3) / 4)
    assert (result["num_texts"], result["num_images"]) == (4, 3)


def test_retrieval_recall_ties_are_not_perfect():
    # Constant scores: ties are ranked by index, so only the texts of image 0 are "found" at rank 0.
    result = retrieval_recall([[0.0] * 4] * 4, [0, 1, 2, 3], ks=(1,))
    assert result["text_to_image_recall@1"] == 0.25


def test_retrieval_recall_evaluate_module_offline():
    metric = evaluation.load("retrieval_recall")
    result = metric.compute(predictions=[[0.9, 0.1], [0.2, 0.8], [0.5, 0.4]], references=[0, 1, 1])
    # Texts: t0→i0 rank 0, t1→i1 rank 0, t2→i1 rank 1. Images: i0 finds t0 first; i1 finds t1 first.
    assert result["text_to_image_recall@1"] == pytest.approx(2 / 3)
    assert result["text_to_image_recall@5"] == 1.0
    assert result["image_to_text_recall@1"] == 1.0


def test_retrieval_recall_rejects_bad_input():
    with pytest.raises(ValueError, match="one integer image index per text"):
        retrieval_recall([[0.1, 0.2]], [0, 1])
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
        retrieval_recall([[0.1, 0.2]], [2])
    with pytest.raises(ValueError, match="NaN"):
        retrieval_recall([[float("nan"), 0.2]], [0])
    with pytest.raises(ValueError, match="same images"):
        evaluation.load("retrieval_recall").compute(predictions=[[0.1, 0.2], [0.3]], references=[0, 1])
