"""The app in a real browser (Debian's headless chromium through selenium): upload an example image, see its regions,
ask, caption and rank, upload a text file — what is on screen is what the pipelines return for the same image, text
and folder, and each state is saved as a screenshot (into $VLHUB_APP_SCREENSHOTS when set: docs/images/ was made so,
with the demo's folders in $VLHUB_APP_FOLDERS; else the test's own tiny folders and a temporary folder)."""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("selenium", reason="selenium is in vlhub[test]")
from tests.app_browser import Page, missing_browser  # noqa: E402

if missing_browser():
    pytest.skip(missing_browser(), allow_module_level=True)

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """vqa, retrieval and captioning folders: $VLHUB_APP_FOLDERS (the demo's, comma-separated in that order) or
    tiny random ones."""
    if os.environ.get("VLHUB_APP_FOLDERS"):
        return dict(zip(("vqa", "retrieval", "captioning"), map(Path, os.environ["VLHUB_APP_FOLDERS"].split(","))))
    from tests.app_helpers import save_tiny_folder

    root = tmp_path_factory.mktemp("browser-folders")
    return {
        task: save_tiny_folder(root / name, model_type, task)
        for task, name, model_type in (
            ("vqa", "uniter-shapes-vqa", "uniter"),
            ("retrieval", "uniter-shapes-retrieval", "uniter"),
            ("captioning", "vlp-shapes-captioning", "unified_vlp"),
        )
    }


@pytest.fixture(scope="module")
def page(folders, tmp_path_factory):
    from tests.test_app import _free_port
    from vlhub.app import VlhubApp, launch

    app = VlhubApp.from_folders(list(folders.values()), examples_dir=tmp_path_factory.mktemp("examples"))
    port = _free_port()
    served = launch(app, port=port, block=False)
    page = Page(f"http://127.0.0.1:{port}/")
    page.app = app
    yield page
    page.close()
    served.close()


def _percent(score: float) -> str:
    return f"{round(score * 100)}%"


def test_the_four_states_and_an_error_in_a_browser(page, folders, tmp_path):
    from PIL import Image
    from transformers import pipeline

    shots = Path(os.environ.get("VLHUB_APP_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    app, example = page.app, page.app.examples[0]
    names = {task: folder.name for task, folder in folders.items()}
    regions = app.models[names["vqa"]].region_extractor(
        Image.open(example.path).convert("RGB"), boxes=[list(b) for b in example.boxes], labels=list(example.labels)
    )

    # Regions.
    status, _ = page.status_after(lambda: page.upload(example.path))
    assert status == f"regions ready for {names['vqa']}"
    assert page.text("regions-info").startswith(f"{len(example.boxes)} regions (the shapes world's objects")
    page.screenshot(shots / "app-regions.png")

    # Ask: the page shows the pipeline's top-5 answers with their scores.
    page.fill("question", example.question)
    status, _ = page.status_after(lambda: page.click("ask-button"))
    assert status.startswith("answered in"), status
    want = pipeline("visual-question-answering", model=str(folders["vqa"]))(
        image=regions, question=example.question, top_k=5
    )
    assert page.answers() == [(w["answer"], _percent(w["score"])) for w in want]
    page.screenshot(shots / "app-answer.png")

    # Caption (beam search of 3) with the captioning model.
    page.pick_model(names["captioning"])
    page.wait_for(lambda: page.text("status") == f"regions ready for {names['captioning']}")
    page.tab("Caption")
    page.click("decoding")  # the radio group; pick "beam"
    [beam] = [b for b in page.driver.find_elements("css selector", "#decoding label") if b.text == "beam"]
    beam.click()
    status, _ = page.status_after(lambda: page.click("caption-button"))
    assert status.startswith("captioned (beam search of 3) in"), status
    captioner = pipeline("image-captioning", model=str(folders["captioning"]))
    caption_regions = app.models[names["captioning"]].region_extractor(
        Image.open(example.path).convert("RGB"), boxes=[list(b) for b in example.boxes], labels=list(example.labels)
    )
    assert page.caption() == captioner(caption_regions, generate_kwargs={"num_beams": 3})[0]["generated_text"]
    page.screenshot(shots / "app-caption.png")

    # Rank with the retrieval model.
    page.pick_model(names["retrieval"])
    page.wait_for(lambda: page.text("status") == f"regions ready for {names['retrieval']}")
    page.tab("Rank")
    texts = ["a large yellow square.", "two red circles.", "a small blue triangle at the bottom.", example.labels[0]]
    page.fill("texts", "\n".join(texts))
    status, _ = page.status_after(lambda: page.click("rank-button"))
    assert status.startswith("ranked 4 texts in"), status
    want = pipeline("image-text-retrieval", model=str(folders["retrieval"]))(image=regions, texts=texts)
    assert page.answers("ranking") == [(f"{n}. {w['text']}", _percent(w["score"])) for n, w in enumerate(want, 1)]
    page.screenshot(shots / "app-ranking.png")

    # A text file: a message in the page, and the app still answers afterwards.
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    page.clear_upload()
    status, _ = page.status_after(lambda: page.upload(notes))
    assert "notes.txt is not an image the app can read" in status
    page.screenshot(shots / "app-error.png")
    page.clear_upload()
    status, _ = page.status_after(lambda: page.upload(example.path))
    assert status == f"regions ready for {names['retrieval']}"
