"""What the original authors report for a release: the figures a converted model card carries as `model-index`.

Each architecture keeps its table in one place, `vlhub/modeling/<arch>/reported_results.py` (`REPORTED_RESULTS`, a
tuple of `ReportedResult`, each with the paper table or README it is copied from). A converter picks the rows of the
release and task it converted (`reported_for`) and `write_model_card` writes them as huggingface_hub `EvalResult`s
(unverified, with their source) and as a table that says they are the authors' numbers, not measured by vlhub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = [
    "ReportedResult",
    "CardResults",
    "source_rows",
    "reported_for",
    "eval_results",
    "reported_section",
    "size_release",
    "BERT_SIZES",
]

# The releases' sizes by hidden width (BERT-base / -large): a converted model of another width (a tiny test model)
# is none of the published releases and gets no reported figures.
BERT_SIZES = {768: "base", 1024: "large"}


@dataclass(frozen=True)
class ReportedResult:
    """One figure the original authors published.

    Attributes:
        release: which released model it belongs to ("base", "large", "beta", "pretrained", ...), as the converter
            names the release it converted.
        task: the vlhub task of the converted head that the figure is for ("vqa", "captioning", ...; the
            converter's task names, plus "zero_shot_retrieval" for a pre-trained model ranking without fine-tuning).
        dataset, dataset_id: the benchmark's name and a short id (`model-index`'s dataset name / type).
        split, metric, value: e.g. "test-dev", "accuracy", 72.27 (in the source's units, percent or CIDEr).
        source, source_url: the paper table or README the figure is copied from.
        setting: what distinguishes figures of one benchmark, split and metric ("cross-entropy" vs "CIDEr
            optimization" captioners, "detected regions" vs "ground-truth regions"); "" when nothing does.
    """

    release: str
    task: str
    dataset: str
    dataset_id: str
    split: str
    metric: str
    value: float
    source: str
    source_url: str
    setting: str = ""


def source_rows(source: str, source_url: str, release: str | None = None) -> Callable[..., ReportedResult]:
    """A maker of the rows copied from one source: `row(release, task, dataset, dataset_id, split, metric, value,
    setting="")`, or without the `release` argument when every row of the source is of `release`."""

    def row(*fields, setting: str = ""):
        fields = (release, *fields) if release is not None else fields
        return ReportedResult(*fields, source=source, source_url=source_url, setting=setting)

    return row


# The Hub's task type of each vlhub task (model-index `task.type`).
_TASK_TYPES = {
    "vqa": "visual-question-answering",
    "gqa": "visual-question-answering",
    "captioning": "image-to-text",
    "retrieval": "image-text-retrieval",
    "zero_shot_retrieval": "image-text-retrieval",
    "nlvr2": "visual-reasoning",
    "ve": "visual-entailment",
    "re": "referring-expression-comprehension",
    "refcoco": "referring-expression-comprehension",
    "vcr": "visual-commonsense-reasoning",
}


def reported_for(table: Iterable[ReportedResult], release: str | None, task: str) -> list[ReportedResult]:
    """The rows of `table` for `release` and `task` (none when the release is unknown, e.g. a model of a size the
    authors did not publish)."""
    if release is None:
        return []
    return [row for row in table if row.release == release and row.task == task]


def eval_results(results: Iterable[ReportedResult]) -> list:
    """`huggingface_hub.EvalResult`s of `results`: unverified, with their source, the setting as the metric config."""
    from huggingface_hub import EvalResult

    return [
        EvalResult(
            task_type=_TASK_TYPES.get(row.task, row.task),
            dataset_type=row.dataset_id,
            dataset_name=row.dataset,
            dataset_split=row.split,
            metric_type=row.metric.lower(),
            metric_name=row.metric,
            metric_value=row.value,
            metric_config=row.setting or None,
            verified=False,
            source_name=f"{row.source} (reported by the original authors, not measured by vlhub)",
            source_url=row.source_url,
        )
        for row in results
    ]


def reported_section(results: Sequence[ReportedResult], release: str | None, known_releases: Iterable[str]) -> str:
    """The model card's section on the authors' figures (markdown)."""
    lines = ["## Results reported by the original authors", ""]
    if not results:
        if release is None:
            lines.append(
                "None listed: this model's size matches none of the published releases "
                f"({', '.join(sorted(set(known_releases)))}), so no published figure describes it."
            )
        else:
            lines.append(
                "None listed: the sources vlhub's table was built from publish no figure for this task of "
                f"the {release} release."
            )
        return "\n".join(lines) + "\n"
    lines += [
        "These are the original authors' published figures for this release and task, copied from the source named in "
        "each row; vlhub did not measure them. A faithful conversion, evaluated as the authors evaluated, should "
        "reproduce them. They are in this card's `model-index` metadata as unverified results.",
        "",
        "| benchmark | split | metric | value | setting | source |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in results:
        lines.append(
            f"| {row.dataset} | {row.split} | {row.metric} | {row.value:g} | {row.setting or '-'} | "
            f"[{row.source}]({row.source_url}) |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class CardResults:
    """The authors' figures one converted card carries: `table`'s rows for `release` (None: a size no published
    release has) and `task`."""

    table: tuple
    release: str | None
    task: str

    @property
    def rows(self) -> list[ReportedResult]:
        return reported_for(self.table, self.release, self.task)

    def section(self) -> str:
        return reported_section(self.rows, self.release, [row.release for row in self.table])


def size_release(hidden_size: int) -> str | None:
    """ "base" / "large" for the BERT widths the releases have, None for any other (a test-size model)."""
    return BERT_SIZES.get(hidden_size)
