"""The Gradio page over a `VlhubApp`: an image (upload or example) → its regions drawn; Ask, Caption and Rank tabs;
a model picker; one status line that reports timings and every bad input (the app keeps serving)."""

from __future__ import annotations

import time

import gradio as gr

from ..demo_pictures import draw_regions
from .core import TASK_LABELS, AppInputError, VlhubApp

__all__ = ["build_app", "launch"]

_TITLE = "vlhub: see what a region-feature vision-language model sees and says"
_SMALL_IMAGE_SIDE = 384  # smaller images (the shapes world's are 64 pixels) are drawn enlarged


def _error(err: AppInputError) -> str:
    return f"⚠️ {err}"


def _respond(run, empty, show, done) -> tuple:
    """`(show(result), done(result, milliseconds))` of `run()`, or `(empty, the message)` for a bad input."""
    start = time.perf_counter()
    try:
        result = run()
    except AppInputError as err:
        return empty, _error(err)
    return show(result), done(result, (time.perf_counter() - start) * 1000)


def _task_notes(app: VlhubApp, name: str | None) -> list:
    """Per task of the page: its button's state and the note under it (why it is disabled)."""
    updates = []
    model = app.models.get(name)
    for task in ("vqa", "captioning", "retrieval"):
        if model is None:
            why = "no model is open"
        else:
            why = model.unavailable.get(task)
        updates.append(gr.update(interactive=why is None))
        updates.append(
            gr.update(
                value=f"*{TASK_LABELS[task]} is not available for this model: {why}*" if why else "",
                visible=why is not None,
            )
        )
    return updates


def _handlers(app: VlhubApp):
    """The page's four actions (regions, ask, caption, rank) on `app`, each returning what its outputs show."""

    def show_regions(name, path):
        if path is None:
            return None, "", ""
        try:
            view = app.regions(name, path)
        except AppInputError as err:
            return None, "", _error(err)
        scale = max(1, _SMALL_IMAGE_SIDE // max(1, min(view.image.size)))
        drawn = draw_regions(view.image, view.regions.boxes.tolist(), view.labels, scale=scale)
        listed = "; ".join(f"{i}: {label}" for i, label in enumerate(view.labels))
        return drawn, view.summary() + (f"  \n{listed}" if listed else ""), f"regions ready for {name}"

    def ask(name, path, question):
        return _respond(
            lambda: app.ask(name, path, question),
            None,
            lambda answers: {a["answer"]: a["score"] for a in answers},
            lambda answers, ms: f"answered in {ms:.0f} ms: {question.strip()}",
        )

    def caption(name, path, decoding, beams):
        num_beams = 1 if decoding == "greedy" else int(beams)
        how = "greedy" if num_beams == 1 else f"beam search of {num_beams}"
        return _respond(
            lambda: app.caption(name, path, num_beams),
            "",
            lambda text: text,
            lambda text, ms: f"captioned ({how}) in {ms:.0f} ms",
        )

    def rank(name, path, texts):
        # numbered, so that two equal texts stay two entries
        return _respond(
            lambda: app.rank(name, path, texts),
            None,
            lambda ranked: {f"{n}. {r['text']}": r["score"] for n, r in enumerate(ranked, start=1)},
            lambda ranked, ms: f"ranked {len(ranked)} texts in {ms:.0f} ms",
        )

    return show_regions, ask, caption, rank


def _image_row(app: VlhubApp):
    """The image input (with the held-out examples) beside the regions drawn on it; built inside the
    caller's `gr.Blocks`, so that `build_app` stays one screen."""
    with gr.Row():
        with gr.Column():
            image = gr.File(label="Image (upload)", type="filepath", elem_id="image-input")
            if app.examples:
                gr.Examples(
                    [[str(e.path)] for e in app.examples],
                    inputs=[image],
                    example_labels=[f"{e.image_id} (shapes world, held out)" for e in app.examples],
                    label="or pick an example",
                )
        with gr.Column():
            regions_image = gr.Image(label="Regions", type="pil", interactive=False, elem_id="regions-image")
            regions_info = gr.Markdown(elem_id="regions-info")
    return image, regions_image, regions_info


def build_app(app: VlhubApp) -> gr.Blocks:
    names = list(app.models)
    first = names[0] if names else None
    show_regions, ask, caption, rank = _handlers(app)

    with gr.Blocks(title="vlhub", analytics_enabled=False) as page:
        gr.Markdown(f"## {_TITLE}")
        gr.Markdown("\n".join(f"- ⚠️ {p}" for p in app.problems), visible=bool(app.problems), elem_id="problems")
        model = gr.Dropdown(
            names,
            value=first,
            label="Model",
            interactive=len(names) > 1,
            elem_id="model",
            info=app.models[first].describe() if first else "no model is open",
        )
        image, regions_image, regions_info = _image_row(app)
        status = gr.Markdown(elem_id="status")
        with gr.Tab("Ask"):
            question = gr.Textbox(
                label="Question",
                placeholder="what colour is the circle?",
                elem_id="question",
                value=app.examples[0].question if app.examples else "",
            )
            ask_button = gr.Button("Ask", variant="primary", elem_id="ask-button")
            ask_note = gr.Markdown(visible=False)
            answers = gr.Label(num_top_classes=5, label="Top-5 answers", elem_id="answers")
        with gr.Tab("Caption"):
            decoding = gr.Radio(["greedy", "beam"], value="greedy", label="Decoding", elem_id="decoding")
            beams = gr.Slider(2, 8, value=3, step=1, label="Beam size (beam search)", elem_id="beams")
            caption_button = gr.Button("Caption", variant="primary", elem_id="caption-button")
            caption_note = gr.Markdown(visible=False)
            caption_text = gr.Textbox(label="Caption", interactive=False, elem_id="caption")
        with gr.Tab("Rank"):
            texts = gr.Textbox(label="Candidate texts, one per line", lines=5, elem_id="texts")
            rank_button = gr.Button("Rank", variant="primary", elem_id="rank-button")
            rank_note = gr.Markdown(visible=False)
            ranking = gr.Label(label="Ranked, best first (score: sigmoid of the matching logit)", elem_id="ranking")

        task_outputs = [ask_button, ask_note, caption_button, caption_note, rank_button, rank_note]
        page.load(lambda name: _task_notes(app, name), inputs=[model], outputs=task_outputs, api_name=False)
        model.change(lambda name: _task_notes(app, name), inputs=[model], outputs=task_outputs, api_name=False)
        model.change(
            lambda name: gr.update(info=app.models[name].describe()), inputs=[model], outputs=[model], api_name=False
        )
        for event in (image.change, model.change):
            event(show_regions, inputs=[model, image], outputs=[regions_image, regions_info, status], api_name=False)
        # "minimal" progress: no overlay to draw over the outputs for the few hundred milliseconds an answer takes
        gr.on(
            [ask_button.click, question.submit],
            ask,
            inputs=[model, image, question],
            outputs=[answers, status],
            api_name="ask",
            show_progress="minimal",
        )
        caption_button.click(
            caption,
            inputs=[model, image, decoding, beams],
            outputs=[caption_text, status],
            api_name="caption",
            show_progress="minimal",
        )
        rank_button.click(
            rank, inputs=[model, image, texts], outputs=[ranking, status], api_name="rank", show_progress="minimal"
        )
        # The same regions as a callable endpoint (the change events above have none).
        gr.Button("Show regions", visible=False).click(
            show_regions, inputs=[model, image], outputs=[regions_image, regions_info, status], api_name="regions"
        )
    return page


def launch(
    app: VlhubApp, host: str = "127.0.0.1", port: int | None = None, block: bool = True, max_file_size: str = "50mb"
) -> gr.Blocks:
    """Serve the page: Gradio's queue runs one model call at a time, so two users never run a model at once."""
    page = build_app(app).queue(default_concurrency_limit=1)
    page.launch(
        server_name=host,
        server_port=port,
        show_error=True,
        max_file_size=max_file_size,
        prevent_thread_lock=not block,
        quiet=not block,
    )
    return page
