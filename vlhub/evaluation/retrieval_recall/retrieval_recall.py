"""Image-text retrieval recall@K (text → image and image → text) as an `evaluate` metric (see
`vlhub.evaluation.retrieval`)."""

import evaluate

from vlhub.evaluation.metric_info import metric_info
from vlhub.evaluation.retrieval import DEFAULT_RECALL_KS, retrieval_recall

_DESCRIPTION = """
Recall@K of image-text retrieval in both directions, from the scores of every text against every image (as UNITER's
evaluation computes it). Text → image: the fraction of texts whose ground-truth image ranks in the top K. Image →
text: the fraction of images (those with at least one text) with at least one of their texts in the top K. Equal
scores are ranked by index.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[list[float]]`): one row per text: its score with every image (all rows equally long).
    references (`list[int]`): for each text, the index of its ground-truth image in the rows.
    ks (`list[int]`, optional): the K of recall@K, default (1, 5, 10).
Returns:
    `text_to_image_recall@K`, `image_to_text_recall@K` for each K, `mean_recall`, `num_texts`, `num_images`.
Examples:
    >>> metric = vlhub.evaluation.load("retrieval_recall")
    >>> metric.compute(predictions=[[0.9, 0.1], [0.2, 0.8]], references=[0, 1], ks=[1])["text_to_image_recall@1"]
    1.0
"""

_CITATION = """
@inproceedings{chen2020uniter, title={UNITER: UNiversal Image-TExt Representation Learning}, author={Chen, Yen-Chun
and Li, Linjie and Yu, Licheng and El Kholy, Ahmed and Ahmed, Faisal and Gan, Zhe and Cheng, Yu and Liu, Jingjing},
booktitle={ECCV}, year={2020}}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RetrievalRecall(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION, ("float64s", "int64"))

    def _compute(self, predictions, references, ks=DEFAULT_RECALL_KS):
        lengths = {len(row) for row in predictions}
        if len(lengths) > 1:
            raise ValueError(f"every prediction row must score the same images; got rows of lengths {sorted(lengths)}")
        return retrieval_recall(predictions, references, ks=ks)
