"""The browser app's handlers (`vlhub.app`), called directly and through `gradio_client` against the app served on
127.0.0.1: the page's answers, captions and rankings are the pipelines' for the same image, text and folder; bad
inputs give messages and the app keeps serving. (The headless-browser test is tests/test_app_browser.py.)"""

import json
import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers import pipeline

from tests.app_helpers import save_tiny_folder
from tests.fresh_interpreter import run_python
from vlhub.app import AppInputError, VlhubApp, demo_folders
from vlhub.data import ShapesWorld

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("app-folders")
    built = {
        name: save_tiny_folder(root / name, model_type, task)
        for name, model_type, task in (
            ("uniter-shapes-vqa", "uniter", "vqa"),
            ("uniter-shapes-retrieval", "uniter", "retrieval"),
            ("vlp-shapes-captioning", "unified_vlp", "captioning"),
        )
    }
    bert = root / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    built["bert"] = bert
    return built


@pytest.fixture(scope="module")
def app(folders, tmp_path_factory):
    return VlhubApp.from_folders(list(folders.values()), examples_dir=tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="module")
def upload(tmp_path_factory):
    """A shapes-world image that is not one of the app's examples (so its regions come from the extractor alone)."""
    scene = ShapesWorld(seed=1, num_train=1, num_validation=0, num_test=1).scenes("test")[0]
    path = tmp_path_factory.mktemp("uploads") / "upload.png"
    Image.fromarray(scene.image).save(path)
    return path


def _example_regions(app, name, example):
    extractor = app.models[name].region_extractor
    return extractor(
        Image.open(example.path).convert("RGB"), boxes=[list(b) for b in example.boxes], labels=list(example.labels)
    )


def _same_ranking(got, want, key):
    assert [r[key] for r in got] == [r[key] for r in want]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], rtol=1e-5, atol=1e-6)


def test_models_open_with_their_tasks_and_bad_folders_are_reported(app, folders):
    assert sorted(app.models) == ["uniter-shapes-retrieval", "uniter-shapes-vqa", "vlp-shapes-captioning"]
    assert {name: model.task for name, model in app.models.items()} == {
        "uniter-shapes-vqa": "vqa",
        "uniter-shapes-retrieval": "retrieval",
        "vlp-shapes-captioning": "captioning",
    }
    assert app.problems == [
        f"{folders['bert']} is not a vlhub model folder: its config.json has model_type 'bert'; "
        "vlhub's are tden, unified_vlp, uniter, vilbert, vl_bert"
    ]
    # A task the architecture cannot do is disabled with the demo's line; one the folder's head does not do says so.
    assert app.models["uniter-shapes-vqa"].unavailable["captioning"] == (
        "UNITER is an encoder without a text decoder: it cannot caption"
    )
    assert "Unified VLP has no retrieval head" in app.models["vlp-shapes-captioning"].unavailable["retrieval"]
    assert "a retrieval model; open one fine-tuned for VQA" in app.models["uniter-shapes-retrieval"].unavailable["vqa"]
    # Packed for the CPU where that pays (the pipelines' default): a captioner wherever torch has oneDNN, an encoder
    # on the CPU kinds where packed encoders were measured faster.
    from vlhub.modeling.packed_linear import packing_pays

    assert (app.models["uniter-shapes-vqa"].packed_linears > 0) == packing_pays(decodes=False)
    assert (app.models["vlp-shapes-captioning"].packed_linears > 0) == packing_pays(decodes=True)


def test_answers_are_the_vqa_pipelines(app, folders, upload):
    vqa = pipeline("visual-question-answering", model=str(folders["uniter-shapes-vqa"]))
    question = "what colour is the circle?"
    got = app.ask("uniter-shapes-vqa", upload, question)
    assert len(got) == 5
    _same_ranking(got, vqa(image=str(upload), question=question, top_k=5), "answer")
    view = app.regions("uniter-shapes-vqa", upload)
    assert view.source == "found by the region extractor" and len(view.regions) >= 1 and view.labels == []
    example = app.examples[0]
    got = app.ask("uniter-shapes-vqa", example.path, example.question)
    want = vqa(image=_example_regions(app, "uniter-shapes-vqa", example), question=example.question, top_k=5)
    _same_ranking(got, want, "answer")
    assert app.regions("uniter-shapes-vqa", example.path).labels == list(example.labels)


def test_captions_are_the_captioning_pipelines(app, folders):
    captioner = pipeline("image-captioning", model=str(folders["vlp-shapes-captioning"]))
    example = app.examples[1]
    regions = _example_regions(app, "vlp-shapes-captioning", example)
    assert app.caption("vlp-shapes-captioning", example.path) == captioner(regions)[0]["generated_text"]
    beam = captioner(regions, generate_kwargs={"num_beams": 3})[0]["generated_text"]
    assert app.caption("vlp-shapes-captioning", example.path, num_beams=3) == beam


def test_rankings_are_the_retrieval_pipelines(app, folders, upload):
    retrieval = pipeline("image-text-retrieval", model=str(folders["uniter-shapes-retrieval"]))
    texts = ["a red circle.", "two blue squares.", "a small green triangle on the left."]
    got = app.rank("uniter-shapes-retrieval", upload, "\n".join(texts[:2]) + "\n\n  " + texts[2] + "  \n")
    _same_ranking(got, retrieval(image=str(upload), texts=texts), "text")


def test_bad_inputs_say_what_is_wrong(app, tmp_path, upload):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not an image")
    with pytest.raises(AppInputError, match="notes.txt is not an image the app can read"):
        app.regions("uniter-shapes-vqa", text_file)
    broken = tmp_path / "broken.png"
    broken.write_bytes(upload.read_bytes()[:200])
    with pytest.raises(AppInputError, match="broken.png is a damaged image"):
        app.ask("uniter-shapes-vqa", broken, "what colour is the circle?")
    with pytest.raises(AppInputError, match="no image yet"):
        app.ask("uniter-shapes-vqa", None, "what colour is the circle?")
    with pytest.raises(AppInputError, match="type a question"):
        app.ask("uniter-shapes-vqa", upload, "   ")
    with pytest.raises(AppInputError, match="candidate texts"):
        app.rank("uniter-shapes-retrieval", upload, "\n  \n")
    with pytest.raises(AppInputError, match="Caption is not available for uniter-shapes-vqa: UNITER is an encoder"):
        app.caption("uniter-shapes-vqa", upload)
    # The shapes extractor names an upload's objects, so Unified VLP (which needs class probabilities) captions it.
    captioner = pipeline("image-captioning", model=str(app.models["vlp-shapes-captioning"].folder))
    assert app.caption("vlp-shapes-captioning", upload) == captioner(image=str(upload))[0]["generated_text"]
    with pytest.raises(AppInputError, match="no open model is called 'nope'"):
        app.ask("nope", upload, "what?")
    blank = tmp_path / "blank.png"
    Image.new("RGB", (64, 64), (236, 236, 236)).save(blank)
    with pytest.raises(AppInputError, match="no regions from this image"):
        app.regions("uniter-shapes-vqa", blank)
    small_limit = VlhubApp(list(app.models.values()), max_image_pixels=1000)
    with pytest.raises(AppInputError, match=r"upload.png is 64x64 pixels, more than the app's limit of 1,000"):
        small_limit.regions("uniter-shapes-vqa", upload)
    # Still serving after all of that.
    assert len(app.ask("uniter-shapes-vqa", upload, "what colour is the circle?")) == 5


def test_no_folder_says_how_to_make_them_and_demo_folders_are_found_in_both_layouts(tmp_path, capsys):
    from vlhub.cli import main

    assert main(["app", "--demo-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bash scripts/demo.sh" in err and err.startswith("vlhub app: error: no model folders")
    for folder in (
        "uniter-shapes-vqa",
        "uniter-shapes-itr",
        "vlp-shapes-captioning",
        "uniter/uniter-shapes-retrieval",
        "uniter-shapes",
        "uniter/uniter-shapes",
        "pictures",
    ):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in demo_folders(tmp_path)] == [
        "uniter/uniter-shapes-retrieval",
        "uniter-shapes-itr",
        "uniter-shapes-vqa",
        "vlp-shapes-captioning",
    ]


def test_import_vlhub_and_its_command_line_do_not_import_gradio():
    code = (
        "import sys, vlhub, vlhub.cli; vlhub.cli.build_parser(); import vlhub.app; "
        "print(sorted(m for m in ('gradio', 'gradio_client') if m in sys.modules))"
    )
    assert run_python(code).strip() == "[]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(app):
    from gradio_client import Client

    from vlhub.app import launch

    port = _free_port()
    page = launch(app, port=port, block=False)
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False)
    finally:
        page.close()


def test_through_gradio_client(served, app, folders, upload, tmp_path):
    from gradio_client import handle_file

    question = "how many shapes are there?"
    label, status = served.predict("uniter-shapes-vqa", handle_file(str(upload)), question, api_name="/ask")
    want = pipeline("visual-question-answering", model=str(folders["uniter-shapes-vqa"]))(
        image=str(upload), question=question, top_k=5
    )
    assert [c["label"] for c in label["confidences"]] == [w["answer"] for w in want]
    np.testing.assert_allclose([c["confidence"] for c in label["confidences"]], [w["score"] for w in want], rtol=1e-5)
    assert status.startswith("answered in")

    example = app.examples[2]
    caption, status = served.predict(
        "vlp-shapes-captioning", handle_file(str(example.path)), "beam", 2, api_name="/caption"
    )
    regions = _example_regions(app, "vlp-shapes-captioning", example)
    captioner = pipeline("image-captioning", model=str(folders["vlp-shapes-captioning"]))
    assert caption == captioner(regions, generate_kwargs={"num_beams": 2})[0]["generated_text"]

    texts = ["a red circle.", "two blue squares."]
    table, status = served.predict(
        "uniter-shapes-retrieval", handle_file(str(upload)), "\n".join(texts), api_name="/rank"
    )
    want = pipeline("image-text-retrieval", model=str(folders["uniter-shapes-retrieval"]))(
        image=str(upload), texts=texts
    )
    assert [c["label"] for c in table["confidences"]] == [f"{n}. {w['text']}" for n, w in enumerate(want, 1)]
    np.testing.assert_allclose([c["confidence"] for c in table["confidences"]], [w["score"] for w in want], rtol=1e-5)
    assert status.startswith("ranked 2 texts in")

    drawn, info, status = served.predict("uniter-shapes-vqa", handle_file(str(example.path)), api_name="/regions")
    assert info.startswith(f"{len(example.boxes)} regions (the shapes world's objects of {example.image_id})")
    assert Image.open(drawn).size == (384, 384)  # the 64-pixel image drawn 6x larger
    assert info.endswith("; ".join(f"{i}: {label}" for i, label in enumerate(example.labels)))

    text_file = tmp_path / "notes.txt"
    text_file.write_text("not an image")
    label, status = served.predict("uniter-shapes-vqa", handle_file(str(text_file)), question, api_name="/ask")
    assert not label and status == "⚠️ notes.txt is not an image the app can read (PNG, JPEG, WebP, ...)"
    _, status = served.predict("uniter-shapes-vqa", handle_file(str(upload)), "", api_name="/ask")
    assert "type a question" in status
    _, status = served.predict("uniter-shapes-vqa", handle_file(str(upload)), "\n", api_name="/rank")
    assert "Rank is not available for uniter-shapes-vqa" in status
    # ... and it still answers.
    label, status = served.predict("uniter-shapes-vqa", handle_file(str(upload)), question, api_name="/ask")
    assert status.startswith("answered in")


def test_the_space_app_opens_the_models_it_is_given(folders, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("space_app", Path(__file__).parents[1] / "spaces" / "app.py")
    space = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(space)
    monkeypatch.setenv("VLHUB_MODELS", f"{folders['uniter-shapes-vqa']}, {folders['vlp-shapes-captioning']}")
    app = space.build()
    assert sorted(app.models) == ["uniter-shapes-vqa", "vlp-shapes-captioning"] and len(app.examples) == 4


def test_the_space_requirements_name_every_dependency():
    import re

    setup = (Path(__file__).parents[1] / "setup.py").read_text()
    needed = re.findall(r'^\s+"([A-Za-z0-9_.-]+)[^"]*",', setup.split("install_requires=[")[1].split("]")[0], re.M)
    needed += ["gradio"]
    listed = [
        re.split(r"[<>=\[ ]", line)[0]
        for line in (Path(__file__).parents[1] / "spaces" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert needed and sorted(needed) == sorted(listed)


def test_without_gradio_the_command_says_how_to_install_it(monkeypatch, capsys, folders):
    from vlhub.cli import main

    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio → ImportError
    assert main(["app", "--model", str(folders["uniter-shapes-vqa"])]) == 2
    assert capsys.readouterr().err.strip() == "vlhub app: error: the app needs gradio: pip install 'vlhub[app]'"
