"""The shapes world: determinism, disjoint splits, correct boxes and answers, the tokenizer, region features."""

import re
from collections import Counter

import datasets
import numpy as np
import pytest
import torch

from vlhub import RegionFeatures
from vlhub.data import (
    ANSWER_VOCABULARY,
    COLOURS,
    OBJECT_ATTRIBUTES,
    OBJECT_CLASSES,
    SHAPES,
    SHAPES_VOCAB_FILE,
    ShapesFeatureExtractor,
    ShapesWorld,
    shapes_tokenizer,
)

TINY = dict(num_train=24, num_validation=8, num_test=8)


@pytest.fixture(scope="module")
def world():
    return ShapesWorld(seed=1, **TINY)


def _png_bytes(dataset):
    return [row["bytes"] for row in dataset.cast_column("image", datasets.Image(decode=False))["image"]]


def _pixels(dataset):
    return [np.asarray(image) for image in dataset["image"]]


# ------------------------------------------------------------------------------------------------ determinism
def test_same_seed_gives_byte_identical_datasets(world):
    again = ShapesWorld(seed=1, **TINY)
    for split in ("train", "validation", "test"):
        assert _png_bytes(world.images()[split]) == _png_bytes(again.images()[split])
        for kind in ("images", "captions", "vqa"):
            first = getattr(world, kind)()[split].remove_columns([c for c in ["image"] if kind == "images"])
            second = getattr(again, kind)()[split].remove_columns([c for c in ["image"] if kind == "images"])
            assert first.to_dict() == second.to_dict()


def test_other_seed_gives_other_images(world):
    other = ShapesWorld(seed=2, **TINY)
    assert not set(_png_bytes(world.images()["train"])) & set(_png_bytes(other.images()["train"]))


def test_an_image_does_not_depend_on_the_size_of_the_splits(world):
    bigger = ShapesWorld(seed=1, num_train=30, num_validation=8, num_test=3)
    assert _png_bytes(bigger.images()["train"])[:24] == _png_bytes(world.images()["train"])
    assert _png_bytes(bigger.images()["validation"]) == _png_bytes(world.images()["validation"])
    assert bigger.vqa()["validation"].to_dict() == world.vqa()["validation"].to_dict()


# The digest of a small world as generated where the world was designed (numpy 2.4, Pillow 13, x86-64). The world
# must be identical on every machine, so a different digest here means it is not — or that the world was changed
# on purpose, which makes this a new world: update the value then, and say so in the change.
PINNED_WORLD_DIGEST = "9f340cde8b6941ac32a2c8e2f158bde6f00b95720674c5adf20d4f7c62902857"


def test_world_is_the_pinned_world():
    import hashlib
    import json

    world = ShapesWorld(seed=0, num_train=6, num_validation=2, num_test=2)
    digest = hashlib.sha256()
    for split in ("train", "validation", "test"):
        for scene in world.scenes(split):
            digest.update(scene.image.tobytes())
        for kind in ("captions", "vqa"):
            digest.update(json.dumps(getattr(world, kind)()[split].to_dict(), sort_keys=True).encode())
        digest.update(json.dumps(world.images()[split].remove_columns("image").to_dict(), sort_keys=True).encode())
    assert digest.hexdigest() == PINNED_WORLD_DIGEST


# ------------------------------------------------------------------------------------------------------ splits
def test_splits_share_no_image(world):
    images = world.images()
    ids = [set(images[s]["image_id"]) for s in ("train", "validation", "test")]
    pixels = [{p.tobytes() for p in _pixels(images[s])} for s in ("train", "validation", "test")]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not ids[a] & ids[b]
            assert not pixels[a] & pixels[b]
    assert [len(images[s]) for s in ("train", "validation", "test")] == [24, 8, 8]
    for kind in (world.captions(), world.vqa()):
        for split in ("train", "validation", "test"):
            assert set(kind[split]["image_id"]) <= set(images[split]["image_id"])


# ------------------------------------------------------------------------------------------------------- boxes
def test_boxes_are_tight_around_the_objects(world):
    """Every pixel far from the background colour lies in a box, and every box edge touches such a pixel."""
    for row in world.images()["train"]:
        image = np.asarray(row["image"]).astype(int)
        height, width = row["image_size"]
        assert image.shape == (height, width, 3)
        border = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
        background = np.median(border, axis=0)
        foreground = np.abs(image - background).sum(axis=2) > 60
        covered = np.zeros_like(foreground)
        assert len(row["boxes"]) == len(row["labels"]) >= 1
        for x1, y1, x2, y2 in (map(int, box) for box in row["boxes"]):
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
            inside = foreground[y1:y2, x1:x2]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            covered[y1:y2, x1:x2] = True
        assert not (foreground & ~covered).any()


def test_labels_describe_the_pixels(world):
    """The object's colour is the palette colour (± jitter) at the centre of its box."""
    for row in world.images()["train"]:
        image = np.asarray(row["image"]).astype(int)
        for (x1, y1, x2, y2), label in zip(row["boxes"], row["labels"]):
            size, colour, shape = label.split()
            assert size in ("small", "large") and colour in COLOURS and shape in SHAPES
            centre = image[int(y1 + y2) // 2, int(x1 + x2) // 2]
            assert np.abs(centre - np.array(COLOURS[colour])).max() <= 12


# ---------------------------------------------------------------------------------------------------- answers
def test_vqa_rows_are_vqa_like(world):
    label2id = world.label2id
    assert world.answer_vocabulary == list(ANSWER_VOCABULARY)
    assert world.id2label == {i: a for a, i in label2id.items()}
    for split in ("train", "validation", "test"):
        for row in world.vqa()[split]:
            answers = row["answers"]
            assert len(answers) == 10
            assert all(a in label2id for a in answers)
            counts = Counter(answers)
            # Mostly the true answer: at least 7 of 10 annotators agree.
            assert counts.most_common(1)[0][1] >= 7
            assert row["multiple_choice_answer"] == counts.most_common(1)[0][0]
            expected = sorted((label2id[a], min(n / 3, 1.0)) for a, n in counts.items())
            assert row["labels"] == [label for label, _ in expected]
            assert row["scores"] == pytest.approx([score for _, score in expected])
            assert row["answer_type"] in world.answer_types


def test_every_answer_type_is_asked(world):
    types = Counter(world.vqa()["train"]["answer_type"])
    assert set(types) == set(world.answer_types)


def _objects(world, split):
    return {row["image_id"]: row for row in world.images()[split]}


def test_answers_are_true_of_the_scene():
    """Re-derive the answers of several question forms from the boxes and labels alone."""
    world = ShapesWorld(seed=5, num_train=60, num_validation=0, num_test=0)
    objects = _objects(world, "train")
    checked = Counter()
    for row in world.vqa()["train"]:
        scene = objects[row["image_id"]]
        labels = scene["labels"]
        centres = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in scene["boxes"]]
        question, answer = row["question"], row["multiple_choice_answer"]
        if match := re.fullmatch(r"how many (shapes|objects) (are there|are in the image|can you see)\?", question):
            assert answer == str(len(labels))
            checked["count"] += 1
        elif match := re.fullmatch(
            r"how many (\w+) (circles|squares|triangles|diamonds) (are there|are in the image|can you see)\?", question
        ):
            colour, shape = match.group(1), match.group(2)[:-1]
            assert answer == str(sum(label.endswith(f"{colour} {shape}") for label in labels))
            checked["count colour shape"] += 1
        elif match := re.fullmatch(r"is there an? (\w+) (\w+)( in the image)?\?", question):
            present = any(label.endswith(f"{match.group(1)} {match.group(2)}") for label in labels)
            assert answer == ("yes" if present else "no")
            checked["exists"] += 1
        elif match := re.fullmatch(r"what (colour|color) is the (circle|square|triangle|diamond)\?", question):
            (label,) = [label for label in labels if label.endswith(match.group(2))]
            assert answer == label.split()[1]
            checked["colour"] += 1
        elif match := re.fullmatch(
            r"where is the (circle|square|triangle|diamond) relative to the (circle|square|triangle|diamond)\?",
            question,
        ):
            (a,) = [i for i, label in enumerate(labels) if label.endswith(match.group(1))]
            (b,) = [i for i, label in enumerate(labels) if label.endswith(match.group(2))]
            dx, dy = centres[a][0] - centres[b][0], centres[a][1] - centres[b][1]
            expected = ("left" if dx < 0 else "right") if abs(dx) > abs(dy) else ("above" if dy < 0 else "below")
            assert answer == expected
            checked["relation"] += 1
        elif match := re.fullmatch(r"is the (circle|square|triangle|diamond) on the left or on the right\?", question):
            (a,) = [i for i, label in enumerate(labels) if label.endswith(match.group(1))]
            assert answer == ("left" if centres[a][0] < scene["image_size"][1] / 2 else "right")
            checked["position"] += 1
    assert all(checked[k] > 0 for k in ("count", "exists", "colour", "relation", "position")), checked


def test_majority_baseline_by_hand(world):
    train = world.vqa()["train"]
    majority = Counter(train["multiple_choice_answer"]).most_common(1)[0][0]
    assert world.majority_answer() == majority
    accuracies = []
    for answers in world.vqa()["validation"]["answers"]:
        matches = sum(a == majority for a in answers)
        accuracies.append(np.mean([min((matches - (a == majority)) / 3, 1) for a in answers]))
    assert world.majority_baseline("validation") == pytest.approx(float(np.mean(accuracies)))
    assert 0 < world.majority_baseline("validation") < 0.5


def test_captions(world):
    captions = world.captions()["train"]
    per_image = Counter(captions["image_id"])
    assert set(per_image.values()) == {5}
    for image_id in per_image:
        texts = [c for c, i in zip(captions["caption"], captions["image_id"]) if i == image_id]
        assert len(set(texts)) == 5
    assert len(set(captions["caption_id"])) == len(captions)


# --------------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_covers_every_text_without_unknown_pieces(world):
    tokenizer = shapes_tokenizer()
    texts = []
    for split in ("train", "validation", "test"):
        texts += list(world.captions()[split]["caption"]) + list(world.vqa()[split]["question"])
    unknown = [t for t in texts if tokenizer.unk_token_id in tokenizer(t)["input_ids"]]
    assert not unknown
    for answer in ANSWER_VOCABULARY:
        assert tokenizer.unk_token_id not in tokenizer(answer)["input_ids"]


def test_tokenizer_lower_cases_and_has_bert_specials():
    tokenizer = shapes_tokenizer()
    assert tokenizer.tokenize("What COLOUR is the Large circle?") == [
        "what",
        "colour",
        "is",
        "the",
        "large",
        "circle",
        "?",
    ]
    vocab = SHAPES_VOCAB_FILE.read_text(encoding="utf-8").split("\n")
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id) == (
        0,
        2,
        3,
        4,
    )
    assert len(tokenizer) == len([w for w in vocab if w])


# ----------------------------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_objects=7), "at most 6"),
        (dict(min_objects=3, max_objects=2), "max_objects must be an integer >= 3"),
        (dict(image_size=16), "image_size must be an integer >= 32"),
        (dict(num_train=0), "num_train must be an integer >= 1"),
        (dict(seed=-1), "seed must be an integer >= 0"),
    ],
)
def test_bad_world_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapesWorld(**kwargs)


def test_unknown_split(world):
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        world.majority_baseline("dev")


# --------------------------------------------------------------------------------------------------- features
def test_region_features_shapes_and_targets(world):
    extractor = ShapesFeatureExtractor(feature_dim=48)
    row = world.images()["train"][0]
    regions = extractor(row["image"], row["boxes"], labels=row["labels"])
    num = len(row["boxes"])
    assert isinstance(regions, RegionFeatures)
    assert regions.features.shape == (num, 48)
    assert torch.equal(regions.boxes, torch.tensor(row["boxes"]))
    assert regions.image_size == tuple(row["image_size"])
    assert torch.equal(regions.scores, torch.ones(num))
    assert regions.class_probs.shape == (num, len(OBJECT_CLASSES))
    assert torch.allclose(regions.class_probs.sum(1), torch.ones(num))
    for probs, attributes, label in zip(regions.class_probs, regions.attribute_probs, row["labels"]):
        size, colour, shape = label.split()
        assert OBJECT_CLASSES[int(probs.argmax())] == f"{colour} {shape}"
        assert probs[0] == 0  # background
        assert OBJECT_ATTRIBUTES[int(attributes.argmax())] == size


def test_whole_image_region_comes_first_as_background(world):
    row = world.images()["train"][1]
    regions = ShapesFeatureExtractor(include_whole_image=True)(row["image"], row["boxes"], labels=row["labels"])
    height, width = row["image_size"]
    assert len(regions) == len(row["boxes"]) + 1
    assert regions.boxes[0].tolist() == [0, 0, width, height]
    assert regions.class_probs[0, 0] == 1 and regions.attribute_probs[0, 0] == 1


def test_features_are_deterministic_and_batch_independent(world):
    rows = world.images()["train"].select(range(4))
    extractor = ShapesFeatureExtractor()
    batch = extractor(list(rows["image"]), list(rows["boxes"]))
    single = [ShapesFeatureExtractor()(r["image"], r["boxes"]) for r in rows]
    for a, b in zip(batch, single):
        assert torch.allclose(a.features, b.features, atol=1e-6)
    # Same weights from a fresh extractor: the projection is drawn from a fixed seed.
    assert torch.equal(extractor.projection, ShapesFeatureExtractor().projection)
    assert not torch.equal(extractor.projection, ShapesFeatureExtractor(projection_seed=1).projection)


def test_region_features_separate_colours_and_shapes():
    """A linear classifier on the region features learns colour and shape of held-out objects."""
    world = ShapesWorld(seed=3, num_train=100, num_validation=40, num_test=0)
    extractor = ShapesFeatureExtractor(feature_dim=64)

    def data(split):
        rows = world.images()[split]
        regions = dict(world.region_features(split, extractor))
        features = torch.cat([regions[i].features for i in rows["image_id"]])
        labels = [label.split() for labels in rows["labels"] for label in labels]
        colours = torch.tensor([list(COLOURS).index(c) for _, c, _ in labels])
        shapes = torch.tensor([SHAPES.index(s) for _, _, s in labels])
        return features, colours, shapes

    train, held_out = data("train"), data("validation")
    for target, classes in ((1, len(COLOURS)), (2, len(SHAPES))):
        torch.manual_seed(0)
        probe = torch.nn.Linear(64, classes)
        optimizer = torch.optim.LBFGS(probe.parameters(), max_iter=20, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(probe(train[0]), train[target])
            loss.backward()
            return loss

        optimizer.step(closure)
        accuracy = (probe(held_out[0]).argmax(1) == held_out[target]).float().mean().item()
        assert accuracy > 0.9, (target, accuracy)


def test_feature_extractor_rejects_bad_input(world):
    extractor = ShapesFeatureExtractor()
    row = world.images()["train"][0]
    with pytest.raises(ValueError, match="not a shapes-world object"):
        extractor(row["image"], row["boxes"][:1], labels=["huge red circle"])
    with pytest.raises(ValueError, match="boxes but"):
        extractor(row["image"], row["boxes"], labels=row["labels"][:-1] if len(row["labels"]) > 1 else [])
    with pytest.raises(ValueError, match=r"\(num_boxes, 4\)"):
        extractor(row["image"], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="uint8 RGB"):
        extractor(np.zeros((8, 8), dtype=np.uint8), [[0, 0, 4, 4]])
    with pytest.raises(TypeError, match="PIL image"):
        extractor(b"png bytes", [[0, 0, 4, 4]])
    with pytest.raises(ValueError, match="no regions"):
        extractor(np.full((40, 40, 3), 200, dtype=np.uint8))
    with pytest.raises(ValueError, match="feature_dim"):
        ShapesFeatureExtractor(feature_dim=0)


def test_detected_boxes_are_the_ground_truth_boxes(world):
    rows = world.images()["validation"]
    detected = ShapesFeatureExtractor()(list(rows["image"]))
    for row, regions in zip(rows, detected):
        expected = sorted(row["boxes"], key=lambda box: (box[1], box[0]))
        assert regions.boxes.tolist() == expected
        # Without labels each object is described from its pixels: the world's own labels, so the class and
        # attribute distributions are those the labelled (training) regions carry.
        order = sorted(range(len(row["boxes"])), key=lambda k: (row["boxes"][k][1], row["boxes"][k][0]))
        labelled = ShapesFeatureExtractor()(row["image"], expected, labels=[row["labels"][k] for k in order])
        assert torch.equal(regions.class_probs, labelled.class_probs)
        assert torch.equal(regions.attribute_probs, labelled.attribute_probs)


def test_a_box_without_an_object_is_background_when_described(world):
    row = world.images()["validation"][0]
    regions = ShapesFeatureExtractor(include_whole_image=True)(row["image"], [[0, 0, 2, 2], row["boxes"][0]])
    assert regions.class_probs[:2, 0].tolist() == [1.0, 1.0]  # the whole image and the empty corner
    assert regions.attribute_probs[:2, 0].tolist() == [1.0, 1.0]
    assert regions.class_probs[2].argmax() > 0


def test_extractor_save_and_load_and_image_paths(world, tmp_path):
    extractor = ShapesFeatureExtractor(feature_dim=32, pool_size=3, include_whole_image=True, projection_seed=7)
    extractor.save_pretrained(tmp_path / "extractor")
    loaded = ShapesFeatureExtractor.from_pretrained(tmp_path / "extractor")
    assert loaded.to_dict() == extractor.to_dict()
    row = world.images()["train"][2]
    row["image"].save(tmp_path / "image.png")
    from_path = loaded(str(tmp_path / "image.png"), row["boxes"])
    assert torch.equal(from_path.features, extractor(row["image"], row["boxes"]).features)
    with pytest.raises(FileNotFoundError, match="config.json"):
        ShapesFeatureExtractor.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------------ store
def test_region_store_round_trip(tmp_path):
    from vlhub.processing.stores import RegionStore

    world = ShapesWorld(seed=4, num_train=5, num_validation=2, num_test=2)
    extractor = ShapesFeatureExtractor(feature_dim=24)
    store = world.write_region_store(tmp_path / "regions", extractor=extractor, shard_size=3)
    expected = {}
    for split in ("train", "validation", "test"):
        expected.update(world.region_features(split, extractor))
    assert len(store) == 9 and set(store.ids) == set(expected)
    for image_id, regions in expected.items():
        stored = store[image_id]
        assert stored.image_size == regions.image_size
        for name in ("features", "boxes", "class_probs", "attribute_probs", "scores"):
            assert torch.equal(getattr(stored, name), getattr(regions, name)), name
    # Writing again resumes: nothing is added twice.
    again = world.write_region_store(tmp_path / "regions", extractor=extractor, shard_size=3)
    assert len(again) == 9
    streamed = {row["image_id"] for row in RegionStore.streaming_dataset(tmp_path / "regions")}
    assert streamed == set(expected)
    # A larger world continues the store; other extractor settings or another world are refused, not mixed in.
    larger = ShapesWorld(seed=4, num_train=7, num_validation=2, num_test=2)
    assert len(larger.write_region_store(tmp_path / "regions", extractor=extractor)) == 11
    from vlhub.processing.stores import StoreSourceMismatchError

    with pytest.raises(StoreSourceMismatchError, match="extractor: the store has"):
        world.write_region_store(tmp_path / "regions", extractor=ShapesFeatureExtractor(feature_dim=24, pool_size=3))
    with pytest.raises(StoreSourceMismatchError, match="shapes_world: the store has"):
        ShapesWorld(seed=5, num_train=5, num_validation=2, num_test=2).write_region_store(
            tmp_path / "regions", extractor=extractor
        )


# ---------------------------------------------------------------------------------------------- with a model
def test_vqa_pipeline_answers_from_shapes_images(world, tmp_path, tiny_uniter_config):
    """A processor carrying the shapes extractor is saved and reloaded, and the VQA pipeline then takes images."""
    from transformers import pipeline

    from vlhub import UniterForQuestionAnswering, UniterProcessor, UniterRegionProcessor

    tokenizer = shapes_tokenizer()
    config = tiny_uniter_config
    config.vocab_size, config.num_region_labels = len(tokenizer), len(OBJECT_CLASSES)
    config.id2label = world.id2label
    config.label2id = world.label2id
    torch.manual_seed(0)
    model = UniterForQuestionAnswering(config).eval()
    processor = UniterProcessor(
        feature_extractor=UniterRegionProcessor(region_feature_dim=config.region_feature_dim), tokenizer=tokenizer
    )
    extractor = ShapesFeatureExtractor(feature_dim=config.region_feature_dim)
    processor.region_extractor = extractor
    model.save_pretrained(tmp_path / "vqa")
    processor.save_pretrained(tmp_path / "vqa")

    vqa = pipeline("visual-question-answering", model=str(tmp_path / "vqa"))
    assert isinstance(vqa.processor.region_extractor, ShapesFeatureExtractor)
    row = world.images()["test"][0]
    question = "how many shapes are there?"
    answers = vqa(image=row["image"], question=question, top_k=2)
    regions = extractor(row["image"], row["boxes"])
    with torch.no_grad():
        logits = model(**processor(text=[question], regions=[regions])).logits[0]
    assert answers[0]["answer"] == world.id2label[int(logits.argmax())]
    assert answers[0]["score"] == pytest.approx(torch.sigmoid(logits).max().item(), abs=1e-6)
