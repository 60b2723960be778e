"""The shapes world: vlhub's embedded default vision-language dataset, generated from a seed, shipped as code.

Images of 1–N coloured shapes (circle, square, triangle, diamond in six colours, small or large) on a pale noisy
background, with ground-truth boxes, several captions per image, and VQA questions (colour, shape, size, count,
yes/no, position, spatial relation) answered by ten simulated annotators with VQA-style soft scores over a fixed
answer vocabulary. Train, validation and test images never coincide. Everything is lower case.

```python
from vlhub.data import ShapesWorld, shapes_tokenizer

world = ShapesWorld(seed=0)
world.images()["train"]      # image_id, image, boxes, labels, image_size
world.captions()["train"]    # caption_id, image_id, caption
world.vqa()["validation"]    # question_id, image_id, question, answers, labels, scores, answer_type, ...
world.multiple_choice(num_choices=4)["train"]   # question_id, image_id, question, choices, label, answer_type
store = world.write_region_store("shapes_regions")   # RegionFeatures of every image in vlhub's sharded store
tokenizer = shapes_tokenizer()
```

Determinism: image `i` of a split is drawn from `np.random.default_rng([seed, split, i, attempt, stream])` alone, so
it does not depend on how many images the other splits have, and the same seed gives byte-identical datasets on
every machine (same numpy/Pillow major versions).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import datasets
import numpy as np
from PIL import Image
from transformers import BertTokenizer

from ..evaluation.vqa import vqa_accuracy_score
from .shapes_features import ShapesFeatureExtractor
from .shapes_language import (
    ANSWER_TYPES,
    ANSWER_VOCABULARY,
    NUM_ANNOTATORS,
    Question,
    annotate,
    contradicting_caption,
    draw_choices,
    make_captions,
    make_questions,
    soft_scores,
)
from .shapes_scene import MAX_OBJECTS_LIMIT, OBJECT_ATTRIBUTES, OBJECT_CLASSES, Scene, ShapeObject, sample_scene

if TYPE_CHECKING:
    from ..processing.regions import RegionFeatures
    from ..processing.stores import RegionStore

__all__ = ["ShapesWorld", "shapes_tokenizer", "SHAPES_VOCAB_FILE", "SPLITS"]

SPLITS: tuple[str, ...] = ("train", "validation", "test")
SHAPES_VOCAB_FILE = Path(__file__).with_name("shapes_vocab.txt")
_MIN_IMAGE_SIZE = 32
_MAX_RESAMPLES = 100  # of an image that repeats one already drawn (practically never needed)
# Independent random streams per image, so adding a caption template does not change the images.
_SCENE_STREAM, _CAPTION_STREAM, _QUESTION_STREAM, _ANNOTATOR_STREAM, _CHOICE_STREAM = range(5)
# The safetensors metadata entry that marks a file written by `ShapesWorld.save` (and its layout's version).
_SAVED_FORMAT_KEY, _SAVED_FORMAT = "vlhub_shapes_world", "1"


def shapes_tokenizer() -> BertTokenizer:
    """The shapes world's WordPiece tokenizer (`vlhub/data/shapes_vocab.txt`).

    Lower-casing is on: the world's texts are lower case, and a user typing "What colour is the Circle?" should get
    the same word pieces. Every word the world produces is a whole entry, so its texts never produce `[UNK]`.
    """
    # transformers 5 reads the vocabulary from `vocab=`; `vocab_file=` would be silently ignored.
    return BertTokenizer(vocab=str(SHAPES_VOCAB_FILE), do_lower_case=True)


@dataclass(frozen=True)
class _Example:
    image_id: str
    scene: Scene
    captions: tuple[str, ...]
    questions: tuple[tuple[Question, tuple[str, ...]], ...]  # (question, annotator answers)


def _saved_example(row: dict, image: np.ndarray) -> _Example:
    """An `_Example` from its `ShapesWorld.save` record (JSON turns tuples into lists: they are tuples again)."""
    objects = tuple(ShapeObject(**{**o, "center": tuple(o["center"]), "box": tuple(o["box"])}) for o in row["objects"])
    questions = tuple(
        (Question(**{**q, "confusions": tuple(q["confusions"])}), tuple(answers)) for q, answers in row["questions"]
    )
    return _Example(row["image_id"], Scene(image, objects), tuple(row["captions"]), questions)


def _check_count(name: str, value, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class ShapesWorld:
    """A seeded shapes world with train/validation/test splits.

    Args:
        seed: the world's seed; the same seed gives the same images, texts and answers everywhere.
        num_train, num_validation, num_test: images per split.
        image_size: side of the square images in pixels (>= 32).
        min_objects, max_objects: objects per image (1 <= min <= max <= 6).
        captions_per_image: distinct captions per image.
        questions_per_image: VQA questions per image (distinct texts; a one-object scene may allow fewer).

    The defaults make a world that a tiny UNITER pretrains and fine-tunes on in a few minutes on 2 CPU cores.
    Images are generated on first use and kept in memory.
    """

    answer_types = ANSWER_TYPES
    object_classes = OBJECT_CLASSES
    object_attributes = OBJECT_ATTRIBUTES

    def __init__(
        self,
        seed: int = 0,
        num_train: int = 2000,
        num_validation: int = 200,
        num_test: int = 200,
        image_size: int = 64,
        min_objects: int = 1,
        max_objects: int = 4,
        captions_per_image: int = 5,
        questions_per_image: int = 6,
    ) -> None:
        self.seed = _check_count("seed", seed, 0)
        self.split_sizes = {
            "train": _check_count("num_train", num_train, 1),
            "validation": _check_count("num_validation", num_validation, 0),
            "test": _check_count("num_test", num_test, 0),
        }
        self.image_size = _check_count("image_size", image_size, _MIN_IMAGE_SIZE)
        self.min_objects = _check_count("min_objects", min_objects, 1)
        self.max_objects = _check_count("max_objects", max_objects, self.min_objects)
        if self.max_objects > MAX_OBJECTS_LIMIT:
            raise ValueError(
                f"max_objects must be at most {MAX_OBJECTS_LIMIT} (counts are answers of the fixed vocabulary "
                f"'0'…'{MAX_OBJECTS_LIMIT}'), got {max_objects}"
            )
        self.captions_per_image = _check_count("captions_per_image", captions_per_image, 1)
        self.questions_per_image = _check_count("questions_per_image", questions_per_image, 1)
        self._datasets: dict[str, datasets.DatasetDict] = {}

    def __repr__(self) -> str:
        sizes = ", ".join(f"num_{k}={v}" for k, v in self.split_sizes.items())
        return f"ShapesWorld(seed={self.seed}, {sizes}, image_size={self.image_size}, max_objects={self.max_objects})"

    @property
    def settings(self) -> dict[str, int]:
        """The arguments that define this world: `ShapesWorld(**world.settings)` draws the same world."""
        return {
            "seed": self.seed,
            **{f"num_{split}": size for split, size in self.split_sizes.items()},
            "image_size": self.image_size,
            "min_objects": self.min_objects,
            "max_objects": self.max_objects,
            "captions_per_image": self.captions_per_image,
            "questions_per_image": self.questions_per_image,
        }

    # ------------------------------------------------------------------------------------------ saved worlds
    def save(self, path: str | os.PathLike) -> Path:
        """Write every drawn example (images, objects, captions, questions with their annotators' answers) and the
        world's `settings` to one safetensors file, atomically; `ShapesWorld.load(path)` gives the same world back
        without drawing it (the default world: 4.6 CPU-s to draw, 0.6 to read back)."""
        from safetensors.numpy import save_file

        from ..utils.files import atomic_write

        examples = [example for split in SPLITS for example in self._examples[split]]
        images = np.stack([e.scene.image for e in examples])  # a world has at least one (train) image
        text = {
            "settings": self.settings,
            "examples": [
                {
                    "image_id": e.image_id,
                    "objects": [dataclasses.asdict(o) for o in e.scene.objects],
                    "captions": e.captions,
                    "questions": [[dataclasses.asdict(q), answers] for q, answers in e.questions],
                }
                for e in examples
            ],
        }
        metadata = {_SAVED_FORMAT_KEY: _SAVED_FORMAT, "world": json.dumps(text)}
        return atomic_write(path, lambda temporary: save_file({"images": images}, temporary, metadata=metadata))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ShapesWorld":
        """The world `save` wrote to `path` (its settings and every example, exactly as drawn)."""
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as handle:
            metadata = handle.metadata() or {}
            if metadata.get(_SAVED_FORMAT_KEY) != _SAVED_FORMAT:
                raise ValueError(f"{path} is not a shapes world written by ShapesWorld.save")
            images = handle.get_tensor("images")
        saved = json.loads(metadata["world"])
        world = cls(**saved["settings"])
        expected = (sum(world.split_sizes.values()), world.image_size, world.image_size, 3)
        if images.shape != expected or len(saved["examples"]) != expected[0]:
            raise ValueError(
                f"{path} holds {len(saved['examples'])} examples and images of shape {images.shape}; its settings "
                f"{saved['settings']} need {expected[0]} of shape {expected}"
            )
        examples = iter(_saved_example(row, image) for row, image in zip(saved["examples"], images))
        world.__dict__["_examples"] = {
            split: [next(examples) for _ in range(world.split_sizes[split])] for split in SPLITS
        }
        return world

    # ------------------------------------------------------------------------------------------------ answers
    @property
    def answer_vocabulary(self) -> list[str]:
        """The fixed answer vocabulary; an answer's index is its label id."""
        return list(ANSWER_VOCABULARY)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(ANSWER_VOCABULARY))

    @property
    def label2id(self) -> dict[str, int]:
        return {answer: i for i, answer in enumerate(ANSWER_VOCABULARY)}

    # ---------------------------------------------------------------------------------------------- generation
    def _rng(self, split: str, index: int, attempt: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, SPLITS.index(split), index, attempt, stream])

    def _example(self, split: str, index: int, seen: set[bytes]) -> _Example:
        for attempt in range(_MAX_RESAMPLES):
            scene = sample_scene(
                self._rng(split, index, attempt, _SCENE_STREAM), self.image_size, self.min_objects, self.max_objects
            )
            digest = hashlib.sha256(scene.image.tobytes()).digest()
            if digest not in seen:
                seen.add(digest)
                break
        else:  # pragma: no cover - needs 100 identical random images in a row
            raise RuntimeError(f"could not draw a new image for {split} {index} after {_MAX_RESAMPLES} attempts")
        captions = make_captions(scene, self._rng(split, index, attempt, _CAPTION_STREAM), self.captions_per_image)
        questions = make_questions(scene, self._rng(split, index, attempt, _QUESTION_STREAM), self.questions_per_image)
        annotator_rng = self._rng(split, index, attempt, _ANNOTATOR_STREAM)
        answered = tuple((q, tuple(annotate(q, annotator_rng))) for q in questions)
        return _Example(f"{split}-{index:06d}", scene, tuple(captions), answered)

    @cached_property
    def _examples(self) -> dict[str, list[_Example]]:
        # Splits are drawn in a fixed order; an image identical to an earlier one (in any split) is redrawn, so no
        # image is shared across splits.
        seen: set[bytes] = set()
        return {split: [self._example(split, i, seen) for i in range(self.split_sizes[split])] for split in SPLITS}

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; the shapes world has {list(SPLITS)}")

    def scenes(self, split: str) -> list[Scene]:
        """The raw scenes (numpy image + objects) of a split."""
        self._check_split(split)
        return [example.scene for example in self._examples[split]]

    # ------------------------------------------------------------------------------------------------ datasets
    def _dataset_dict(self, kind: str, features: datasets.Features, rows_of) -> datasets.DatasetDict:
        if kind not in self._datasets:
            splits = {}
            for split in SPLITS:
                columns = {name: [] for name in features}
                for example in self._examples[split]:
                    for row in rows_of(example):
                        for name in features:
                            columns[name].append(row[name])
                splits[split] = datasets.Dataset.from_dict(columns, features=features, split=split)
            self._datasets[kind] = datasets.DatasetDict(splits)
        return self._datasets[kind]

    def images(self) -> datasets.DatasetDict:
        """Per split: `image_id` (str), `image` (`datasets.Image`, PNG), `boxes` (list of `[x1, y1, x2, y2]` pixels),
        `labels` (an object description per box, e.g. "large red circle"), `image_size` (`[height, width]`)."""
        features = datasets.Features(
            {
                "image_id": datasets.Value("string"),
                "image": datasets.Image(),
                "boxes": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
                "labels": datasets.List(datasets.Value("string")),
                "image_size": datasets.List(datasets.Value("int32"), length=2),
            }
        )

        def rows(example: _Example):
            yield {
                "image_id": example.image_id,
                "image": Image.fromarray(example.scene.image),
                "boxes": [list(map(float, o.box)) for o in example.scene.objects],
                "labels": [o.label for o in example.scene.objects],
                "image_size": list(example.scene.image_size),
            }

        return self._dataset_dict("images", features, rows)

    def captions(self) -> datasets.DatasetDict:
        """Per split: `caption_id`, `image_id`, `caption` (`captions_per_image` rows per image)."""
        features = datasets.Features(
            {
                "caption_id": datasets.Value("string"),
                "image_id": datasets.Value("string"),
                "caption": datasets.Value("string"),
            }
        )

        def rows(example: _Example):
            for k, caption in enumerate(example.captions):
                yield {"caption_id": f"{example.image_id}-c{k}", "image_id": example.image_id, "caption": caption}

        return self._dataset_dict("captions", features, rows)

    def vqa(self) -> datasets.DatasetDict:
        """Per split: `question_id`, `image_id`, `question`, `answers` (the 10 annotators' answers), `labels` (answer
        ids of the distinct answers, ascending) with `scores` (min(#annotators / 3, 1) each), `answer_type`, and
        `multiple_choice_answer` (the most frequent annotator answer, as in VQA v2)."""
        features = datasets.Features(
            {
                "question_id": datasets.Value("string"),
                "image_id": datasets.Value("string"),
                "question": datasets.Value("string"),
                "answers": datasets.List(datasets.Value("string"), length=NUM_ANNOTATORS),
                "labels": datasets.List(datasets.Value("int64")),
                "scores": datasets.List(datasets.Value("float32")),
                "answer_type": datasets.Value("string"),
                "multiple_choice_answer": datasets.Value("string"),
            }
        )
        label2id = self.label2id

        def rows(example: _Example):
            for k, (question, answers) in enumerate(example.questions):
                scores = sorted((label2id[a], s) for a, s in soft_scores(list(answers)).items())
                yield {
                    "question_id": f"{example.image_id}-q{k}",
                    "image_id": example.image_id,
                    "question": question.text,
                    "answers": list(answers),
                    "labels": [label for label, _ in scores],
                    "scores": [score for _, score in scores],
                    "answer_type": question.answer_type,
                    "multiple_choice_answer": Counter(answers).most_common(1)[0][0],
                }

        return self._dataset_dict("vqa", features, rows)

    def multiple_choice(self, num_choices: int = 4) -> datasets.DatasetDict:
        """The VQA questions as multiple choice. Per split: `question_id`, `image_id`, `question`, `choices`
        (`num_choices` distinct answers), `label` (the index of the right one), `answer_type`.

        The right answer is the question's `multiple_choice_answer`; the `num_choices - 1` distractors are drawn
        without replacement from the other answers of the same answer type (the `multiple_choice_answer`s of that
        type in the train split), and the right answer's position is drawn too (`draw_choices`), from a generator
        seeded by the world's seed, the split and the row, so the same world gives the same choices everywhere.
        Questions of an answer type with fewer than `num_choices` answers (with 4 choices: yes/no and size) are
        left out; `multiple_choice_skipped_types(num_choices)` names them."""
        num_choices = _check_count("num_choices", num_choices, 2)
        key = f"multiple_choice-{num_choices}"
        if key not in self._datasets:
            pools = self._answer_pools()
            features = datasets.Features(
                {
                    "question_id": datasets.Value("string"),
                    "image_id": datasets.Value("string"),
                    "question": datasets.Value("string"),
                    "choices": datasets.List(datasets.Value("string")),
                    "label": datasets.Value("int64"),
                    "answer_type": datasets.Value("string"),
                }
            )
            splits = {}
            for split, questions in self.vqa().items():
                rows = []
                for number, question in enumerate(questions):
                    kind = question["answer_type"]
                    if len(pools[kind]) < num_choices:
                        continue
                    rng = np.random.default_rng([self.seed, SPLITS.index(split), number, _CHOICE_STREAM])
                    choices, label = draw_choices(question["multiple_choice_answer"], pools[kind], num_choices, rng)
                    rows.append(
                        {
                            "question_id": question["question_id"],
                            "image_id": question["image_id"],
                            "question": question["question"],
                            "choices": choices,
                            "label": label,
                            "answer_type": kind,
                        }
                    )
                splits[split] = datasets.Dataset.from_list(rows, features=features, split=split)
            self._datasets[key] = datasets.DatasetDict(splits)
        return self._datasets[key]

    def _answer_pools(self) -> dict[str, list[str]]:
        """answer type → the distinct `multiple_choice_answer`s of that type in the train split, sorted (every type
        of `ANSWER_TYPES`, empty when the split has none)."""
        train = self.vqa()["train"]
        pools = {kind: set() for kind in ANSWER_TYPES}
        for kind, answer in zip(train["answer_type"], train["multiple_choice_answer"]):
            pools[kind].add(answer)
        return {kind: sorted(answers) for kind, answers in pools.items()}

    def multiple_choice_skipped_types(self, num_choices: int = 4) -> list[str]:
        """The answer types whose questions `multiple_choice(num_choices)` leaves out (too few distinct answers)."""
        return [kind for kind, pool in self._answer_pools().items() if len(pool) < num_choices]

    def scene(self, image_id: str) -> Scene:
        """The scene of an image id (`"<split>-<index>"`, as the datasets name them)."""
        split, _, index = image_id.rpartition("-")
        if split not in SPLITS or not index.isdigit() or int(index) >= self.split_sizes[split]:
            raise KeyError(
                f"no image {image_id!r} in this shapes world (ids are '<split>-<index>', e.g. 'train-000000')"
            )
        return self._examples[split][int(index)].scene

    def contradicting_caption(self, image_id: str, caption: str, rng: np.random.Generator) -> str | None:
        """`caption` with one word changed so that it is false of image `image_id` (another colour, shape or size
        than the image has, a flipped relation or position, another count), or None when no word allows that: the
        hard negatives of image-text matching. See `shapes_language.contradicting_caption`."""
        return contradicting_caption(self.scene(image_id), caption, rng)

    # ---------------------------------------------------------------------------------------------- baselines
    def majority_answer(self) -> str:
        """The most frequent `multiple_choice_answer` of the train split (ties: the earlier vocabulary entry)."""
        counts = Counter(self.vqa()["train"]["multiple_choice_answer"][:])  # [:]: the column at once, not row by row
        return max(ANSWER_VOCABULARY, key=lambda answer: (counts[answer], -ANSWER_VOCABULARY.index(answer)))

    def majority_baseline(self, split: str = "validation") -> float:
        """VQA accuracy (official rule) on `split` of always answering the most frequent train answer."""
        self._check_split(split)
        answers = self.vqa()[split]["answers"][:]
        if not answers:
            raise ValueError(f"the {split} split of this world has no questions")
        prediction = self.majority_answer()
        return sum(vqa_accuracy_score(prediction, refs) for refs in answers) / len(answers)

    # --------------------------------------------------------------------------------------------- regions
    def region_features(
        self,
        split: str,
        extractor: ShapesFeatureExtractor | None = None,
        batch_size: int = 64,
        skip: set[str] | frozenset[str] = frozenset(),
    ) -> Iterator[tuple[str, RegionFeatures]]:
        """Yield `(image_id, RegionFeatures)` for every image of `split` not in `skip`: ground-truth boxes, features
        from `extractor` (default `ShapesFeatureExtractor()`), class/attribute targets from the object labels."""
        self._check_split(split)
        extractor = extractor or ShapesFeatureExtractor()
        examples = [e for e in self._examples[split] if e.image_id not in skip]
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            regions = extractor(
                [e.scene.image for e in batch],
                [[o.box for o in e.scene.objects] for e in batch],
                labels=[[o.label for o in e.scene.objects] for e in batch],
            )
            yield from ((e.image_id, r) for e, r in zip(batch, regions))

    def write_region_store(
        self,
        directory: str | Path,
        extractor: ShapesFeatureExtractor | None = None,
        splits: tuple[str, ...] = SPLITS,
        shard_size: int = 512,
        batch_size: int = 64,
        feature_dtype: str = "float32",
    ) -> RegionStore:
        """Extract every image's regions (of `splits`) and write them to vlhub's sharded region store at `directory`
        (`shard_size` images per shard, features stored as `feature_dtype`).

        Resumable: images already in finished shards are skipped. The store records the world's drawing settings and
        the extractor's (its source), so continuing it with others is refused rather than mixed in; a world with
        more images per split continues it. Returns `RegionStore(directory)`, keyed by `image_id` (ids are unique
        across splits, so one store serves all of them). Call it from one process (e.g. under accelerate's
        `main_process_first()`): extracting the whole default world takes seconds.
        """
        from ..processing.stores import RegionStore, RegionStoreWriter

        for split in splits:
            self._check_split(split)
        extractor = extractor or ShapesFeatureExtractor()
        # An image depends on these and on its split and index only: a larger world draws the same first images.
        drawing = {key: self.settings[key] for key in ("seed", "image_size", "min_objects", "max_objects")}
        source = {"shapes_world": drawing, "extractor": extractor.to_dict()}
        with RegionStoreWriter(directory, shard_size=shard_size, feature_dtype=feature_dtype, source=source) as writer:
            done = set(writer.completed_ids)
            for split in splits:
                for image_id, regions in self.region_features(split, extractor, batch_size, skip=done):
                    writer.add(image_id, regions)
        return RegionStore(directory)
