"""VQA accuracy as an `evaluate` metric: the official answer normalisation and leave-one-annotator-out
min(#humans/3, 1) rule (see `vlhub.evaluation.vqa`)."""

import evaluate

from vlhub.evaluation.metric_info import STRING_VS_STRINGS, metric_info
from vlhub.evaluation.vqa import vqa_accuracy_score

_DESCRIPTION = """
VQA accuracy (Antol et al. 2015; Goyal et al. 2017) exactly as the official evaluation script computes it: the
predicted answer is normalised (punctuation, lower case, number words to digits, articles dropped, contractions),
and a question's accuracy is the average over its ten annotators of min(#other annotators giving the predicted
answer / 3, 1). The result is the mean over questions, in [0, 1] (the leaderboard reports it × 100).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one predicted answer per question.
    references (`list[list[str]]`): the annotators' answers of each question (10 in VQA v2).
    answer_types (`list[str]`, optional): a type per question (e.g. "yes/no", "number", "other"); adds
        `accuracy_<type>` for each type.
Returns:
    accuracy (`float`): mean accuracy in [0, 1]; plus `accuracy_<type>` with `answer_types`.
Examples:
    >>> metric = vlhub.evaluation.load("vqa_accuracy")
    >>> metric.compute(predictions=["Two"], references=[["2"] * 10])
    {'accuracy': 1.0}
"""

_CITATION = """
@inproceedings{antol2015vqa, title={VQA: Visual Question Answering}, author={Antol, Stanislaw and Agrawal,
Aishwarya and Lu, Jiasen and Mitchell, Margaret and Batra, Dhruv and Zitnick, C. Lawrence and Parikh, Devi},
booktitle={ICCV}, year={2015}}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class VqaAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(
            _DESCRIPTION,
            _CITATION,
            _KWARGS_DESCRIPTION,
            STRING_VS_STRINGS,
            reference_urls=[
                "https://github.com/GT-Vision-Lab/VQA/blob/master/PythonEvaluationTools/vqaEvaluation/vqaEval.py"
            ],
        )

    def _compute(self, predictions, references, answer_types=None):
        if len(predictions) == 0:
            raise ValueError("vqa_accuracy needs at least one prediction")
        scores = [vqa_accuracy_score(p, r) for p, r in zip(predictions, references)]
        result = {"accuracy": sum(scores) / len(scores)}
        if answer_types is not None:
            if len(answer_types) != len(scores):
                raise ValueError(
                    f"got {len(answer_types)} answer_types for {len(scores)} predictions; pass one per question"
                )
            by_type = {}
            for answer_type, score in zip(answer_types, scores):
                by_type.setdefault(answer_type, []).append(score)
            for answer_type in sorted(by_type):
                result[f"accuracy_{answer_type}"] = sum(by_type[answer_type]) / len(by_type[answer_type])
        return result
