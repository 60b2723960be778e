"""Recall@K of image-text retrieval, both directions, from a text × image score matrix (as UNITER's `itm_eval`).

- text → image: for each text, the rank of its ground-truth image among all images;
- image → text: for each image that has at least one ground-truth text, the best rank among its texts.

Recall@K is the fraction of queries whose rank is below K. Equal scores are ranked by index (a stable sort of the
negated scores), so a constant score matrix does not count as perfect retrieval.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["retrieval_recall", "retrieval_chance", "DEFAULT_RECALL_KS"]

DEFAULT_RECALL_KS = (1, 5, 10)


def _ranks(scores: np.ndarray) -> np.ndarray:
    """`ranks[i, j]`: position of column j when row i is sorted by descending score (ties by column index)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(scores.shape[1])[None, :].repeat(scores.shape[0], 0), axis=1)
    return ranks


def retrieval_recall(
    scores: Sequence[Sequence[float]] | np.ndarray, text_to_image: Sequence[int], ks: Sequence[int] = DEFAULT_RECALL_KS
) -> dict[str, float]:
    """Args:
        scores: `(num_texts, num_images)` similarity of every text with every image (higher is better).
        text_to_image: `(num_texts,)` index of each text's ground-truth image (a column of `scores`).
        ks: the K of recall@K.

    Returns `text_to_image_recall@K` and `image_to_text_recall@K` for each K, their mean `mean_recall`, and the
    query counts `num_texts` and `num_images` (images with at least one text).
    """
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"scores must be a non-empty (num_texts, num_images) matrix, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("scores contains NaN or infinite values")
    targets = np.asarray(text_to_image)
    if targets.shape != (matrix.shape[0],) or not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(
            f"text_to_image must hold one integer image index per text ({matrix.shape[0]} texts), got "
            f"{targets.shape} of {targets.dtype}"
        )
    if targets.min() < 0 or targets.max() >= matrix.shape[1]:
        raise ValueError(
            f"text_to_image indices must lie in [0, {matrix.shape[1]}), got {targets.min()}…{targets.max()}"
        )
    if any(int(k) < 1 for k in ks):
        raise ValueError(f"every K of recall@K must be >= 1, got {list(ks)}")
    text_ranks = _ranks(matrix)[np.arange(matrix.shape[0]), targets]
    image_ranks_all = _ranks(matrix.T)  # (num_images, num_texts)
    images = np.unique(targets)
    image_ranks = np.array([image_ranks_all[image, targets == image].min() for image in images])
    result: dict[str, float] = {}
    for k in ks:
        result[f"text_to_image_recall@{k}"] = float((text_ranks < k).mean())
    for k in ks:
        result[f"image_to_text_recall@{k}"] = float((image_ranks < k).mean())
    result["mean_recall"] = float(np.mean([v for v in result.values()]))
    result["num_texts"] = int(matrix.shape[0])
    result["num_images"] = int(len(images))
    return result


def retrieval_chance(
    text_to_image: Sequence[int], num_images: int, ks: Sequence[int] = DEFAULT_RECALL_KS
) -> dict[str, float]:
    """The expected `retrieval_recall` of random scores for the same gallery: text → image recall@K is K / images;
    image → text recall@K is the chance that K texts drawn from all of them hold one of the image's own
    (`1 - C(T - n, K) / C(T, K)` for an image with n of the T texts), averaged over the images with texts."""
    from math import comb

    targets = np.asarray(text_to_image)
    if num_images < 1 or targets.ndim != 1 or targets.size == 0:
        raise ValueError(f"need at least one image and one text, got {num_images} images and {targets.size} texts")
    total = targets.size
    counts = np.unique(targets, return_counts=True)[1]
    result: dict[str, float] = {}
    for k in ks:
        result[f"text_to_image_recall@{k}"] = min(int(k), num_images) / num_images
        result[f"image_to_text_recall@{k}"] = float(
            np.mean([1.0 - comb(total - n, min(int(k), total)) / comb(total, min(int(k), total)) for n in counts])
        )
    return result
