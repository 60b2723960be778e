"""The pieces the demo is built from: hard ITM negatives of the shapes world, mismatched pairs, chance recall, the
per-architecture step plan and the picture writer (the demo itself runs end to end in test_training_cli.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlhub.data import COLOURS, SHAPES, ShapesWorld
from vlhub.data.shapes_language import contradicting_caption
from vlhub.data.shapes_scene import Scene, ShapeObject
from vlhub.demo import DEMO_STEPS, demo_plan, summary_table
from vlhub.demo_pictures import ExamplePicture, write_example_picture
from vlhub.evaluation import retrieval_chance
from vlhub.training.objectives import ObjectiveContext, mismatched_pair

_OPPOSITES = {("left", "right"), ("above", "below"), ("over", "under"), ("top", "bottom")}
_PLURAL = {"circles": "circle", "squares": "square", "triangles": "triangle", "diamonds": "diamond"}


def _one_object_scene(shape="circle", colour="red", size="large", center=(16, 32)):
    image = np.full((64, 64, 3), 236, dtype=np.uint8)
    return Scene(image=image, objects=(ShapeObject(shape, colour, size, center, 9, (7, 23, 25, 41)),))


def test_contradiction_of_a_hand_made_scene_is_one_of_the_expected_sentences():
    scene = _one_object_scene()
    expected = {f"a large {c} circle on the left." for c in ("green", "blue", "yellow", "purple", "orange")}
    expected |= {f"a large red {s} on the left." for s in ("square", "triangle", "diamond")}
    expected |= {"a small red circle on the left.", "a large red circle on the right."}
    seen = {
        contradicting_caption(scene, "a large red circle on the left.", np.random.default_rng(i)) for i in range(200)
    }
    assert seen == expected
    # Articles follow the new word: no "an" before a consonant gives a negative away.
    scene = _one_object_scene(colour="orange")
    seen = {contradicting_caption(scene, "an orange circle.", np.random.default_rng(i)) for i in range(100)}
    assert "a red circle." in seen and "an orange circle." not in seen
    assert all(s.startswith("an orange ") or s.startswith("a ") and s[2] not in "aeiou" for s in seen)


def test_no_contradiction_when_no_word_allows_one():
    assert contradicting_caption(_one_object_scene(), "there is one shape.", np.random.default_rng(0)) is None


def test_contradictions_of_world_captions_change_one_word_into_something_false():
    world = ShapesWorld(seed=3, num_train=40, num_validation=0, num_test=0)
    captions = world.captions()["train"]
    image_ids, texts = list(captions["image_id"]), list(captions["caption"])  # each column read once
    rng = np.random.default_rng(0)
    made = 0
    for image_id, caption in zip(image_ids, texts):
        scene = world.scene(image_id)
        changed = world.contradicting_caption(image_id, caption, rng)
        if changed is None:
            continue
        made += 1
        before, after = caption.split(" "), changed.split(" ")
        assert len(before) == len(after)
        diffs = [(a.strip(".,:"), b.strip(".,:")) for a, b in zip(before, after) if a != b and a not in ("a", "an")]
        assert len(diffs) == 1, (caption, changed)
        old, new = diffs[0]
        if new in COLOURS:
            assert new not in {o.colour for o in scene.objects}
        elif new in SHAPES or new in _PLURAL:
            assert _PLURAL.get(new, new) not in {o.shape for o in scene.objects}
        elif new in ("small", "large"):
            assert new not in {o.size for o in scene.objects}
        elif (old, new) in _OPPOSITES or (new, old) in _OPPOSITES:
            pass
        else:
            assert old in ("two", "three", "four", "five", "six") and new in ("two", "three", "four", "five", "six")
        assert changed not in texts[image_ids.index(image_id) :][:5]
    assert made > 150  # almost every caption has a word that can be contradicted


def test_scene_lookup_names_a_wrong_id():
    world = ShapesWorld(seed=3, num_train=2, num_validation=0, num_test=0)
    with pytest.raises(KeyError, match="train-000005"):
        world.scene("train-000005")


def _context(contradict, probability):
    return ObjectiveContext(
        tokenizer=None,
        random_token_ids=torch.tensor([0]),
        mlm_probability=0.15,
        region_mask_probability=0.15,
        itm_negative_probability=0.5,
        encode=None,
        other_image=lambda image_id, rng: "other",
        contradict=contradict,
        itm_hard_negative_probability=probability,
    )


def test_mismatched_pair_keeps_the_image_for_hard_negatives_and_swaps_it_otherwise():
    example = {"image_id": "img", "caption": "a red circle.", "seed": (0,)}
    hard = mismatched_pair(_context(lambda i, c, rng: "a blue circle.", 1.0), example, np.random.default_rng(0))
    assert hard == {**example, "caption": "a blue circle."}
    swapped = mismatched_pair(_context(lambda i, c, rng: "a blue circle.", 0.0), example, np.random.default_rng(0))
    assert swapped == {**example, "image_id": "other"}
    # No contradiction possible: the image is swapped instead.
    assert (
        mismatched_pair(_context(lambda i, c, rng: None, 1.0), example, np.random.default_rng(0))["image_id"] == "other"
    )
    assert mismatched_pair(_context(None, 1.0), example, np.random.default_rng(0))["image_id"] == "other"


def test_chance_recall_by_hand():
    # 2 images with 2 texts each: a random image for a text is right half the time; 2 random texts out of 4 miss
    # both of an image's texts in 1 of the C(4, 2) = 6 draws.
    chance = retrieval_chance([0, 0, 1, 1], num_images=2, ks=(1, 2))
    assert chance["text_to_image_recall@1"] == 0.5 and chance["text_to_image_recall@2"] == 1.0
    assert chance["image_to_text_recall@1"] == pytest.approx(0.5)
    assert chance["image_to_text_recall@2"] == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="at least one image"):
        retrieval_chance([], num_images=2)


def test_every_architecture_gets_every_step_run_or_skipped_with_one_line():
    for model_type in ("uniter", "vl_bert", "vilbert", "unified_vlp", "tden"):
        plan = demo_plan(model_type)
        assert [s.name for s in plan] == list(DEMO_STEPS)
        assert all(s.skip is None or (s.skip and "\n" not in s.skip and len(s.skip) < 120) for s in plan)
    runs = {t: {s.name for s in demo_plan(t) if s.skip is None} for t in ("uniter", "vl_bert", "unified_vlp", "tden")}
    assert runs["uniter"] == {"pretraining", "vqa", "retrieval"}
    assert runs["vl_bert"] == {"pretraining", "vqa"}
    assert runs["unified_vlp"] == {"pretraining", "vqa", "captioning"}
    vl_bert = {s.name: s.skip for s in demo_plan("vl_bert")}
    assert "matching head" in vl_bert["retrieval"] and "cannot caption" in vl_bert["captioning"]
    with pytest.raises(ValueError, match="unknown model type"):
        demo_plan("no_such_model")


def test_summary_table_aligns_columns():
    table = summary_table([("VQA", "accuracy", "0.500", "0.131"), ("retrieval", "R@1", "0.10", "0.02 (chance)")])
    lines = table.splitlines()
    assert lines[0].split() == ["task", "metric", "vlhub", "baseline"] and set(lines[1]) == {"-", " "}
    assert lines[2].index("0.500") == lines[3].index("0.10") == lines[0].index("vlhub")


def test_picture_has_the_image_its_boxes_and_the_text(tmp_path):
    image = np.full((64, 64, 3), 240, dtype=np.uint8)
    image[20:30, 10:20] = (215, 35, 35)
    path = write_example_picture(
        tmp_path / "example.png",
        ExamplePicture(
            image=image,
            boxes=[[10, 20, 20, 30]],
            title="test-000000",
            region_labels=["small red square"],
            sections=[("VQA", ["Q: what colour is the square?", "A: red"])],
        ),
    )
    picture = np.asarray(Image.open(path).convert("RGB"))
    assert picture.shape[1] > 4 * 64 and picture.shape[0] >= 4 * 64
    # The image is drawn 4x larger at an 8-pixel margin: the red square's centre stays red, its box edge is dark.
    assert tuple(picture[8 + 4 * 25, 8 + 4 * 15]) == (215, 35, 35)
    assert picture[8 + 4 * 25, 8 + 4 * 10].max() < 60
    text_area = picture[:, 8 + 4 * 64 + 8 :]
    assert (text_area < 128).any()  # something is written beside the image
    assert not list(tmp_path.glob(".*tmp"))  # written atomically


def test_picture_rejects_mismatched_labels_and_bad_boxes(tmp_path):
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="2 region labels for 1 boxes"):
        write_example_picture(tmp_path / "a.png", ExamplePicture(image, [[0, 0, 4, 4]], "x", ["a", "b"]))
    with pytest.raises(ValueError, match="x2 >= x1"):
        write_example_picture(tmp_path / "b.png", ExamplePicture(image, [[5, 0, 4, 4]], "x"))


def test_a_demo_step_is_reused_when_finished_with_the_same_settings_and_redone_otherwise(tmp_path):
    from argparse import Namespace

    from vlhub.demo import DEMO_STEP_FILE, Demo

    calls = []

    class Result:
        def __init__(self, argv):
            self.eval_results = {"score": float(len(calls))}

    def main(argv):  # stands for pretrain_main / finetune_main, which create the output folder
        calls.append(argv)
        Path(argv[argv.index("--output_dir") + 1]).mkdir(parents=True, exist_ok=True)
        return Result(argv)

    demo = object.__new__(Demo)  # only run_step: no world, no training
    demo.args = Namespace(overwrite_output_dir=False)
    first, second = tmp_path / "pretrained", tmp_path / "finetuned"
    assert demo.run_step(main, first, None, ["--max_steps", "5"]) == {"score": 1.0}
    assert demo.run_step(main, second, first, ["--max_steps", "3"]) == {"score": 2.0}
    assert calls == [
        ["--output_dir", str(first), "--max_steps", "5"],
        ["--model_name_or_path", str(first), "--output_dir", str(second), "--max_steps", "3"],
    ]
    # Again: both reused, nothing trained.
    assert demo.run_step(main, first, None, ["--max_steps", "5"]) == {"score": 1.0}
    assert demo.run_step(main, second, first, ["--max_steps", "3"]) == {"score": 2.0}
    assert len(calls) == 2
    # Other settings are refused in one line naming the flag.
    with pytest.raises(SystemExit, match="other settings .*--overwrite_output_dir"):
        demo.run_step(main, first, None, ["--max_steps", "6"])
    # The flag starts the step over; the step after it then starts over too (its model changed).
    demo.args.overwrite_output_dir = True
    demo.run_step(main, first, None, ["--max_steps", "5"])
    demo.args.overwrite_output_dir = False
    assert demo.run_step(main, second, first, ["--max_steps", "3"]) == {"score": 4.0}
    assert "--overwrite_output_dir" in calls[2] and "--overwrite_output_dir" in calls[3]
    assert json.loads((second / DEMO_STEP_FILE).read_text())["settings"] == ["--max_steps", "3"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--max_eval_samples", "-1"], "--max_eval_samples must be 0 (all) or more, got -1"),
        (["--gallery_images", "0"], "--gallery_images must be at least 1, got 0"),
        (["--pretrain_steps", "0"], "--pretrain_steps must be at least 1"),
        (["--finetune_steps", "-5"], "--finetune_steps must be 0 (none) or more, got -5"),
        (["--retrieval_steps", "-1"], "--retrieval_steps must be 0 (none) or more, got -1"),
        (["--caption_steps", "-1"], "--caption_steps must be 0 (none) or more, got -1"),
        (["--caption_metrics", "BLEU"], "invalid choice: 'BLEU'"),
    ],
)
def test_bad_evaluation_sizes_are_refused_before_anything_runs(tmp_path, capsys, arguments, message):
    from vlhub.demo import main

    with pytest.raises(SystemExit):
        main(["--output_dir", str(tmp_path / "demo"), *arguments])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
