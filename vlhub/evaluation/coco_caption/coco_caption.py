"""COCO caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D) as an `evaluate` metric (see
`vlhub.evaluation.captions`)."""

import evaluate

from vlhub.evaluation.captions import CAPTION_METRICS, caption_scores
from vlhub.evaluation.metric_info import STRING_VS_STRINGS, metric_info

_DESCRIPTION = """
The COCO caption evaluation (pycocoevalcap): captions and references are PTB-tokenized (lowercased, punctuation
removed), then BLEU-1..4, METEOR 1.5, ROUGE-L and CIDEr-D are computed over the whole corpus; CIDEr-D's document
frequencies come from the references of the corpus scored. Needs Java (the PTB tokenizer and METEOR are Java
programs).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image.
    metrics (`list[str]`, optional): a subset of the metrics below (METEOR is the slow one); default all.
Returns:
    `Bleu_1`, `Bleu_2`, `Bleu_3`, `Bleu_4`, `METEOR`, `ROUGE_L`, `CIDEr` (CIDEr-D) and `num_images`.
Examples:
    >>> metric = vlhub.evaluation.load("coco_caption")
    >>> metric.compute(predictions=["a dog runs"], references=[["a dog runs", "a dog is running"]])["Bleu_1"]
"""

_CITATION = """
@article{chen2015microsoft, title={Microsoft COCO Captions: Data Collection and Evaluation Server}, author={Chen,
Xinlei and Fang, Hao and Lin, Tsung-Yi and Vedantam, Ramakrishna and Gupta, Saurabh and Doll{\\'a}r, Piotr and
Zitnick, C. Lawrence}, journal={arXiv:1504.00325}, year={2015}}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CocoCaption(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION, STRING_VS_STRINGS)

    def _compute(self, predictions, references, metrics=CAPTION_METRICS):
        return caption_scores(predictions, references, metrics=metrics)
