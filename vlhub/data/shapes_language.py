"""Language of the shapes world: captions, VQA questions, simulated annotators, and the fixed answer vocabulary.

Everything is lower case. Questions are only asked when their answer is unambiguous in the scene (objects are
referred to by the fewest attributes that single them out; spatial relations only when one axis clearly
dominates). Ten simulated annotators answer each question: most give the true answer, a few (0–3, drawn per
question) give a plausible confusion — a neighbouring colour, an off-by-one count, the flipped yes/no, the relation
along the other axis — so the soft scores look like VQA's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import permutations
from typing import Iterable

import numpy as np

from .shapes_scene import COLOURS, MAX_OBJECTS_LIMIT, SHAPES, SIZES, Scene, ShapeObject, spatial_relation

__all__ = [
    "ANSWER_VOCABULARY",
    "ANSWER_TYPES",
    "NUM_ANNOTATORS",
    "Question",
    "make_captions",
    "make_questions",
    "annotate",
    "soft_scores",
    "vocabulary_words",
    "draw_choices",
]

RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom")  # which half of the image an object is in
COUNTS: tuple[str, ...] = tuple(str(n) for n in range(MAX_OBJECTS_LIMIT + 1))
# The fixed answer vocabulary: its order defines the answer ids (label ids of a VQA head).
ANSWER_VOCABULARY: tuple[str, ...] = (*COLOURS, *SHAPES, *SIZES, *COUNTS, "yes", "no", *RELATIONS, "top", "bottom")
ANSWER_TYPES: tuple[str, ...] = ("colour", "shape", "size", "count", "yes/no", "position", "relation")
NUM_ANNOTATORS = 10
# How many of the ten annotators give a confusion instead of the true answer, and how often.
_CONFUSED_ANNOTATORS = np.array([0, 1, 2, 3])
_CONFUSED_WEIGHTS_PERMILLE = np.array([550, 250, 120, 80])

_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six")
_PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "diamond": "diamonds"}
_GENERIC_NOUNS = ("shape", "object")
_GENERIC_PLURALS = {"shape": "shapes", "object": "objects"}
_RELATION_PHRASES = {
    "left": ("to the left of", "left of"),
    "right": ("to the right of", "right of"),
    "above": ("above", "over"),
    "below": ("below", "under"),
}
# Plausible confusions of an annotator who looked carelessly.
_COLOUR_CONFUSIONS = {
    "red": ("orange", "purple"),
    "green": ("blue", "yellow"),
    "blue": ("purple", "green"),
    "yellow": ("orange", "green"),
    "purple": ("blue", "red"),
    "orange": ("red", "yellow"),
}
_SHAPE_CONFUSIONS = {
    "circle": ("square", "diamond"),
    "square": ("diamond", "circle"),
    "triangle": ("diamond",),
    "diamond": ("square", "triangle"),
}
_COLOUR_WORDS = ("colour", "color")
# An object is "in the left half" only when its centre is at least this far (fraction of the side) from the middle.
_HALF_MARGIN = 0.12
_POSITION_WORDS = (("top", "middle", "bottom"), ("left", "center", "right"))


@dataclass(frozen=True)
class Question:
    """A question, its true answer, its type, and the answers an annotator may confuse it with."""

    text: str
    answer: str
    answer_type: str
    confusions: tuple[str, ...]


def _choice(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _phrase(obj: ShapeObject, attributes: tuple[str, ...], noun: str = "shape") -> str:
    """E.g. attributes ("size", "colour") → "large red shape"; with "shape" the noun is the object's shape."""
    words = [obj.size] if "size" in attributes else []
    if "colour" in attributes:
        words.append(obj.colour)
    words.append(obj.shape if "shape" in attributes else noun)
    return " ".join(words)


def _matches(obj: ShapeObject, other: ShapeObject, attributes: tuple[str, ...]) -> bool:
    return all(getattr(obj, a) == getattr(other, a) for a in attributes)


def _unique_reference(
    obj: ShapeObject,
    scene: Scene,
    candidates: tuple[tuple[str, ...], ...],
    rng: np.random.Generator,
    noun: str | None = None,
) -> str | None:
    """The phrase over the first of `candidates` (attribute sets) that singles `obj` out, or None. Without "shape"
    in the set the noun is `noun` (default: "shape" or "object" at random)."""
    for attributes in candidates:
        if not any(o is not obj and _matches(obj, o, attributes) for o in scene.objects):
            return _phrase(obj, attributes, noun=noun or _choice(rng, _GENERIC_NOUNS))
    return None


_ANY_REFERENCE = (("shape",), ("colour", "shape"), ("size", "colour", "shape"))


# ----------------------------------------------------------------------------------------------------- captions
def _plural(phrase: str) -> str:
    words = phrase.split()
    words[-1] = _PLURALS.get(words[-1]) or _GENERIC_PLURALS[words[-1]]
    return " ".join(words)


def _listing(objects, rng) -> str:
    """E.g. "two red circles and a small blue square": identical descriptions are counted, in order of appearance."""
    detail = ("size", "colour", "shape") if rng.integers(2) else ("colour", "shape")
    counts = Counter(_phrase(o, detail) for o in objects)
    items = [_with_article(p) if n == 1 else f"{_NUMBER_WORDS[n]} {_plural(p)}" for p, n in counts.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _caption_listing(scene: Scene, rng) -> str:
    n = len(scene.objects)
    noun = _choice(rng, _GENERIC_NOUNS)
    listing = _listing(scene.objects, rng)
    if n == 1:
        return _choice(rng, (f"there is one {noun}: {listing}.", f"a picture of {listing}.", f"{listing}."))
    return _choice(
        rng,
        (
            f"there are {_NUMBER_WORDS[n]} {_GENERIC_PLURALS[noun]}: {listing}.",
            f"a picture of {listing}.",
            f"{_NUMBER_WORDS[n]} {_GENERIC_PLURALS[noun]}: {listing}.",
            f"this image shows {listing}.",
        ),
    )


def _caption_relation(scene: Scene, rng) -> str | None:
    pairs = [(a, b, spatial_relation(a, b, scene.image_size[1])) for a, b in permutations(scene.objects, 2)]
    pairs = [(a, b, rel[0]) for a, b, rel in pairs if rel is not None]
    if not pairs:
        return None
    a, b, relation = _choice(rng, pairs)
    detail = ("colour", "shape") if rng.integers(2) else ("size", "colour", "shape")
    return f"{_with_article(_phrase(a, detail))} is {_choice(rng, _RELATION_PHRASES[relation])} {_with_article(_phrase(b, detail))}."


def _caption_count(scene: Scene, rng) -> str:
    obj = _choice(rng, scene.objects)
    attributes = _choice(rng, (("colour",), ("shape",), ("colour", "shape"), ("size",)))
    noun = _choice(rng, _GENERIC_NOUNS)
    n = sum(_matches(obj, o, attributes) for o in scene.objects)
    phrase = _phrase(obj, attributes, noun)
    if n > 1:
        return f"there are {_NUMBER_WORDS[n]} {_plural(phrase)}."
    return _choice(rng, (f"there is one {phrase}.", f"there is only one {phrase}."))


def _position_words(obj: ShapeObject, image_size: int) -> str:
    column = min(3 * obj.center[0] // image_size, 2)
    row = min(3 * obj.center[1] // image_size, 2)
    vertical, horizontal = _POSITION_WORDS[0][row], _POSITION_WORDS[1][column]
    if vertical == "middle" and horizontal == "center":
        return "in the center"
    if vertical == "middle":
        return f"on the {horizontal}"
    if horizontal == "center":
        return f"at the {vertical}"
    return f"in the {vertical} {horizontal}"


def _caption_position(scene: Scene, rng) -> str:
    obj = _choice(rng, scene.objects)
    detail = ("colour", "shape") if rng.integers(2) else ("size", "colour", "shape")
    return f"{_with_article(_phrase(obj, detail))} {_position_words(obj, scene.image_size[1])}."


_CAPTION_TEMPLATES = (_caption_listing, _caption_relation, _caption_count, _caption_position)


def make_captions(scene: Scene, rng: np.random.Generator, count: int) -> list[str]:
    """Up to `count` distinct captions (fewer only when the scene does not allow that many distinct sentences)."""
    captions: list[str] = []
    for _attempt in range(20 * count):
        if len(captions) == count:
            break
        caption = _choice(rng, _CAPTION_TEMPLATES)(scene, rng)
        if caption is not None and caption not in captions:
            captions.append(caption)
    return captions


# ---------------------------------------------------------------------------------------------------- questions
def _question_colour(scene: Scene, rng) -> Question | None:
    obj = _choice(rng, scene.objects)
    ref = _unique_reference(obj, scene, (("shape",), ("size", "shape")), rng)
    if ref is None:
        return None
    word = _choice(rng, _COLOUR_WORDS)
    text = _choice(
        rng, (f"what {word} is the {ref}?", f"what is the {word} of the {ref}?", f"which {word} is the {ref}?")
    )
    return Question(text, obj.colour, "colour", _COLOUR_CONFUSIONS[obj.colour])


def _question_shape(scene: Scene, rng) -> Question | None:
    obj = _choice(rng, scene.objects)
    # The noun is "object": not "what is the shape of the red shape?"
    ref = _unique_reference(obj, scene, (("colour",), ("size", "colour"), ("size",)), rng, noun="object")
    if ref is None:
        return None
    text = _choice(rng, (f"what shape is the {ref}?", f"what is the shape of the {ref}?"))
    return Question(text, obj.shape, "shape", _SHAPE_CONFUSIONS[obj.shape])


def _question_size(scene: Scene, rng) -> Question | None:
    obj = _choice(rng, scene.objects)
    ref = _unique_reference(obj, scene, (("shape",), ("colour",), ("colour", "shape")), rng)
    if ref is None:
        return None
    other = "large" if obj.size == "small" else "small"
    text = _choice(rng, (f"what size is the {ref}?", f"is the {ref} small or large?", f"how big is the {ref}?"))
    return Question(text, obj.size, "size", (other,))


def _question_count(scene: Scene, rng) -> Question:
    kind = _choice(rng, ("all", "all", "colour", "colour", "shape", "shape", "size", "colour shape"))
    # Mostly ask about attributes present in the scene, sometimes about any (so that "0" stays an answer but does
    # not dominate).
    if rng.integers(4):
        obj = _choice(rng, scene.objects)
        colour, shape, size = obj.colour, obj.shape, obj.size
    else:
        colour, shape, size = _choice(rng, tuple(COLOURS)), _choice(rng, SHAPES), _choice(rng, SIZES)
    noun = _choice(rng, _GENERIC_NOUNS)
    plural = _GENERIC_PLURALS[noun]
    if kind == "all":
        n, phrase = len(scene.objects), plural
    elif kind == "colour":
        n, phrase = sum(o.colour == colour for o in scene.objects), f"{colour} {plural}"
    elif kind == "shape":
        n, phrase = sum(o.shape == shape for o in scene.objects), _PLURALS[shape]
    elif kind == "size":
        n, phrase = sum(o.size == size for o in scene.objects), f"{size} {plural}"
    else:
        n = sum(o.colour == colour and o.shape == shape for o in scene.objects)
        phrase = f"{colour} {_PLURALS[shape]}"
    text = _choice(
        rng,
        (f"how many {phrase} are there?", f"how many {phrase} are in the image?", f"how many {phrase} can you see?"),
    )
    confusions = tuple(str(c) for c in (n - 1, n + 1) if 0 <= c <= MAX_OBJECTS_LIMIT)
    return Question(text, str(n), "count", confusions)


def _absent_description(scene: Scene, rng) -> tuple[str, str] | None:
    """A (colour, shape) pair that no object in the scene has."""
    present = {(o.colour, o.shape) for o in scene.objects}
    absent = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in present]
    return _choice(rng, absent) if absent else None


def _question_exists(scene: Scene, rng) -> Question | None:
    if rng.integers(2):
        obj = _choice(rng, scene.objects)
        colour, shape, answer = obj.colour, obj.shape, "yes"
    else:
        pair = _absent_description(scene, rng)
        if pair is None:
            return None
        (colour, shape), answer = pair, "no"
    text = _choice(
        rng,
        (
            f"is there {_with_article(f'{colour} {shape}')}?",
            f"is there {_with_article(f'{colour} {shape}')} in the image?",
            f"are there any {colour} {_PLURALS[shape]}?",
        ),
    )
    return Question(text, answer, "yes/no", ("no",) if answer == "yes" else ("yes",))


def _question_verify_colour(scene: Scene, rng) -> Question | None:
    obj = _choice(rng, scene.objects)
    ref = _unique_reference(obj, scene, (("shape",), ("size", "shape")), rng)
    if ref is None:
        return None
    if rng.integers(2):
        colour, answer = obj.colour, "yes"
    else:
        colour, answer = _choice(rng, tuple(c for c in COLOURS if c != obj.colour)), "no"
    return Question(f"is the {ref} {colour}?", answer, "yes/no", ("no",) if answer == "yes" else ("yes",))


def _question_position(scene: Scene, rng) -> Question | None:
    """Which half of the image an object is in: one object to find, then its location (easier than relations)."""
    obj = _choice(rng, scene.objects)
    ref = _unique_reference(obj, scene, _ANY_REFERENCE, rng)
    size = scene.image_size[1]
    axis = int(rng.integers(2))
    offset = obj.center[axis] - size / 2
    if ref is None or abs(offset) < _HALF_MARGIN * size:
        return None
    if axis == 0:
        answer, other = ("left", "right") if offset < 0 else ("right", "left")
        text = _choice(rng, (f"is the {ref} on the left or on the right?", f"which side of the image is the {ref} on?"))
    else:
        answer, other = ("top", "bottom") if offset < 0 else ("bottom", "top")
        text = _choice(
            rng, (f"is the {ref} at the top or at the bottom?", f"is the {ref} in the top or the bottom half?")
        )
    return Question(text, answer, "position", (other,))


def _related_pair(scene: Scene, rng):
    pairs = []
    for a, b in permutations(scene.objects, 2):
        relation = spatial_relation(a, b, scene.image_size[1])
        ref_a = _unique_reference(a, scene, _ANY_REFERENCE, rng)
        ref_b = _unique_reference(b, scene, _ANY_REFERENCE, rng)
        if relation is not None and ref_a is not None and ref_b is not None:
            pairs.append((ref_a, ref_b, relation))
    return _choice(rng, pairs) if pairs else None


def _question_relation(scene: Scene, rng) -> Question | None:
    pair = _related_pair(scene, rng)
    if pair is None:
        return None
    ref_a, ref_b, (relation, secondary) = pair
    text = _choice(
        rng,
        (
            f"where is the {ref_a} relative to the {ref_b}?",
            f"where is the {ref_a} compared to the {ref_b}?",
            f"is the {ref_a} left of, right of, above or below the {ref_b}?",
        ),
    )
    return Question(text, relation, "relation", (secondary,))


def _question_verify_relation(scene: Scene, rng) -> Question | None:
    pair = _related_pair(scene, rng)
    if pair is None:
        return None
    ref_a, ref_b, (relation, secondary) = pair
    asked, answer = (
        (relation, "yes") if rng.integers(2) else (_choice(rng, tuple(r for r in RELATIONS if r != relation)), "no")
    )
    phrase = _choice(rng, _RELATION_PHRASES[asked])
    return Question(f"is the {ref_a} {phrase} the {ref_b}?", answer, "yes/no", ("no",) if answer == "yes" else ("yes",))


# Question generators and how often each is tried; together they cover every answer type.
_QUESTION_TEMPLATES = (
    (_question_colour, 3),
    (_question_shape, 3),
    (_question_size, 1),
    (_question_count, 3),
    (_question_exists, 2),
    (_question_verify_colour, 1),
    (_question_position, 2),
    (_question_relation, 2),
    (_question_verify_relation, 1),
)
_TEMPLATE_TABLE = tuple(fn for fn, weight in _QUESTION_TEMPLATES for _ in range(weight))


def make_questions(scene: Scene, rng: np.random.Generator, count: int) -> list[Question]:
    """Up to `count` questions with distinct texts (fewer only for scenes that allow fewer)."""
    questions: list[Question] = []
    texts: set[str] = set()
    for _attempt in range(20 * count):
        if len(questions) == count:
            break
        question = _choice(rng, _TEMPLATE_TABLE)(scene, rng)
        if question is not None and question.text not in texts:
            questions.append(question)
            texts.add(question.text)
    return questions


# -------------------------------------------------------------------------------------------------- annotators
def annotate(question: Question, rng: np.random.Generator) -> list[str]:
    """Ten simulated annotator answers: the true answer, except for 0–3 annotators who give a confusion."""
    answers = [question.answer] * NUM_ANNOTATORS
    if not question.confusions:
        return answers
    cumulative = np.cumsum(_CONFUSED_WEIGHTS_PERMILLE)
    confused = int(_CONFUSED_ANNOTATORS[np.searchsorted(cumulative, rng.integers(cumulative[-1]), side="right")])
    for position in rng.permutation(NUM_ANNOTATORS)[:confused]:
        answers[int(position)] = _choice(rng, question.confusions)
    return answers


def soft_scores(answers: list[str]) -> dict[str, float]:
    """VQA training targets: every distinct answer scores min(#annotators giving it / 3, 1)."""
    counts: dict[str, int] = {}
    for answer in answers:
        counts[answer] = counts.get(answer, 0) + 1
    return {answer: min(n / 3.0, 1.0) for answer, n in counts.items()}


# -------------------------------------------------------------------------------------------------- vocabulary
def draw_choices(answer: str, pool: Iterable[str], num_choices: int, rng: np.random.Generator) -> tuple[list[str], int]:
    """A multiple-choice question's candidates: `answer` and `num_choices - 1` distractors drawn without replacement
    from `pool` (the other answers of its answer type; `answer` itself and repeats in `pool` are ignored), in a
    random order. Returns `(choices, index of answer)`; raises when the pool has too few other answers."""
    others = sorted(set(pool) - {answer})
    if len(others) < num_choices - 1:
        raise ValueError(
            f"{num_choices} choices for the answer {answer!r} need {num_choices - 1} other answers of its "
            f"type, there are {len(others)}: {others}"
        )
    distractors = [others[i] for i in rng.choice(len(others), num_choices - 1, replace=False)]
    label = int(rng.integers(num_choices))
    return [*distractors[:label], answer, *distractors[label:]], label


def vocabulary_words() -> list[str]:
    """Every word and punctuation mark the world's captions and questions can contain (plus digits and the answer
    words), for building the WordPiece vocabulary."""
    template_words = """
        a an the is are there one only this image shows picture of in and what which how many can you see
        shape object shapes objects colour color size big small large or left right above below over under to
        relative compared where any top middle bottom center on at side half
    """.split()
    words = set(template_words)
    words.update(COLOURS, SHAPES, SIZES, _PLURALS.values(), _NUMBER_WORDS, COUNTS, ANSWER_VOCABULARY)
    words.update(str(d) for d in range(10))
    return sorted(words) + [".", ",", ":", "?"]


# ------------------------------------------------------------------------------------------ contradicting captions
_SHAPE_WORDS = {**{s: s for s in SHAPES}, **{p: s for s, p in _PLURALS.items()}}  # word → shape
_FLIPS = {
    "left": "right",
    "right": "left",
    "above": "below",
    "below": "above",
    "over": "under",
    "under": "over",
    "top": "bottom",
    "bottom": "top",
}
_COUNT_WORDS = _NUMBER_WORDS[2:]  # plural counts: swapping one keeps the sentence grammatical


def contradicting_caption(scene: Scene, caption: str, rng: np.random.Generator) -> str | None:
    """`caption` with one word changed so that it is false of `scene`: a colour, shape or size the scene does not
    have, a relation or position flipped (left/right, above/below, over/under, top/bottom), or another plural count.
    None when no word of the caption can be changed that way (e.g. "there is one shape.").

    Each change is false by construction: captions only mention objects of their scene, so naming an absent colour,
    shape or size describes nothing there; relations and positions are only stated when unambiguous, so their
    opposite is false; counts are exact. The sentence stays grammatical, so only the image can tell the difference.
    """
    words = caption.split(" ")
    colours = {o.colour for o in scene.objects}
    shapes = {o.shape for o in scene.objects}
    sizes = {o.size for o in scene.objects}
    candidates: list[tuple[int, str]] = []
    for i, token in enumerate(words):
        word, tail = token.rstrip(".,:"), token[len(token.rstrip(".,:")) :]
        if word in COLOURS:
            candidates += [(i, c + tail) for c in COLOURS if c not in colours and c != word]
        elif word in _SHAPE_WORDS:
            plural = word != _SHAPE_WORDS[word]
            candidates += [
                (i, (_PLURALS[s] if plural else s) + tail)
                for s in SHAPES
                if s not in shapes and s != _SHAPE_WORDS[word]
            ]
        elif word in SIZES:
            candidates += [(i, s + tail) for s in SIZES if s not in sizes and s != word]
        elif word in _FLIPS:
            candidates.append((i, _FLIPS[word] + tail))
        elif word in _COUNT_WORDS:
            candidates += [(i, n + tail) for n in _COUNT_WORDS if n != word]
    if not candidates:
        return None
    position, replacement = candidates[int(rng.integers(len(candidates)))]
    words[position] = replacement
    if position > 0 and words[position - 1] in ("a", "an"):  # "an orange" → "a red": no article gives it away
        words[position - 1] = _with_article(replacement).split(" ")[0]
    return " ".join(words)
