"""The VQA accuracy of the official evaluation (GT-Vision-Lab/VQA, `vqaEval.py`): answer normalisation and the
leave-one-annotator-out min(#humans/3, 1) rule.

What the official script does, and therefore what this module does:

- the predicted answer: newlines/tabs become spaces, outer whitespace is stripped, then *punctuation* processing
  (see `process_punctuation`), then *digit/article* processing: lower-case, number words zero…ten (and "none")
  become digits, the articles a/an/the are dropped, and apostrophe-less contractions get their apostrophe
  ("dont" → "don't");
- the ten reference answers: whitespace-stripped, and punctuation-processed only when they are not all the same
  string (the official annotations are already normalised, so references are not lower-cased or de-articled);
- accuracy of a question: for each of the ten annotators, min(#other annotators matching the prediction / 3, 1),
  averaged over the ten.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig

__all__ = [
    "normalize_answer",
    "process_punctuation",
    "process_digits_and_articles",
    "vqa_accuracy_score",
    "predictable_answer_logits",
]

# The official lists (data of the VQA evaluation, reproduced so our numbers match the leaderboard's).
_PUNCTUATION = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
_NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
_ARTICLES = frozenset({"a", "an", "the"})
# Written-without-apostrophe form → the form with apostrophes.
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've",
    "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's",
    "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's",
    "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas",
    "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll",
    "whyre": "why're", "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}  # fmt: skip
# A thousands separator between digits ("1,000") makes every punctuation mark vanish instead of becoming a space.
_DIGIT_COMMA_DIGIT = re.compile(r"(\d)(,)(\d)")
# The official pattern. Its "(?!<=\d)" is a look-ahead (for the literal "<=" and a digit), not a look-behind, so in
# effect every period not followed by a digit is deleted: "2.5" keeps its period, "dog." loses it.
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_MATCHES_FOR_FULL_CREDIT = 3


def process_punctuation(text: str) -> str:
    """Each official punctuation mark is deleted when it touches a space somewhere in the text (or the text has a
    digit-comma-digit), otherwise replaced by a space; periods not followed by a digit are deleted."""
    out = text
    delete_all = _DIGIT_COMMA_DIGIT.search(text) is not None
    for mark in _PUNCTUATION:
        if delete_all or (mark + " ") in text or (" " + mark) in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    # The official call passes re.UNICODE (= 32) where `sub` takes its count: at most 32 periods are deleted.
    return _PERIOD.sub("", out, count=int(re.UNICODE))


def process_digits_and_articles(text: str) -> str:
    """Lower-case; number words → digits; drop a/an/the; restore apostrophes of contractions."""
    words = [_NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [word for word in words if word not in _ARTICLES]
    return " ".join(_CONTRACTIONS.get(word, word) for word in words)


def normalize_answer(answer: str) -> str:
    """The official normalisation of a *predicted* answer, e.g. "Two." → "2", "a dog" → "dog"."""
    answer = answer.replace("\n", " ").replace("\t", " ").strip()
    return process_digits_and_articles(process_punctuation(answer))


def vqa_accuracy_score(prediction: str, references: Sequence[str]) -> float:
    """Accuracy of one predicted answer against the annotators' answers (official rule; see the module docstring).

    Raises `TypeError`/`ValueError` for a prediction that is not a string or an empty reference list.
    """
    if not isinstance(prediction, str):
        raise TypeError(f"a predicted answer must be a string, got {type(prediction).__name__}")
    if isinstance(references, str) or len(references) == 0:
        raise ValueError(
            f"references must be the list of annotator answers (10 in VQA) for the question, got {references!r}"
        )
    predicted = normalize_answer(prediction)
    answers = [str(answer).replace("\n", " ").replace("\t", " ").strip() for answer in references]
    if len(set(answers)) > 1:
        answers = [process_punctuation(answer) for answer in answers]
    matching = sum(answer == predicted for answer in answers)
    # Leaving out annotator i removes one match exactly when annotator i matched.
    total = sum(min((matching - (answer == predicted)) / _MATCHES_FOR_FULL_CREDIT, 1.0) for answer in answers)
    return total / len(answers)


def predictable_answer_logits(logits: "torch.Tensor", config: "PreTrainedConfig") -> "torch.Tensor":
    """VQA answer logits `(..., num_labels)` with the vocabulary's "unknown" answer (`config.unknown_answer_id`, when
    a config sets one) at -inf, so that no argmax or top-k ever picks it — as the original evaluations that skip the
    answer vocabulary's `<unk>` (Unified VLP: `argmax(logits[:, 1:]) + 1`). Without one, `logits` unchanged."""
    unknown = getattr(config, "unknown_answer_id", None)
    if unknown is None:
        return logits
    if not 0 <= unknown < logits.shape[-1]:
        raise ValueError(f"config.unknown_answer_id={unknown} is not one of the {logits.shape[-1]} answers")
    if logits.shape[-1] == 1:
        raise ValueError("config.unknown_answer_id excludes the only answer the head has")
    import torch

    return logits.index_fill(-1, torch.tensor([unknown], device=logits.device), float("-inf"))
