"""The browser app's speed as a user sees it: page action → result on screen, in Debian's headless chromium.

    python bench/bench_app.py [--demo-dir runs/demo] [--model FOLDER ...] [--repeats 10]

Opens the folders (default: the demo's, as `vlhub app` does), serves the page on 127.0.0.1 and drives it with
selenium (tests/app_browser.py): per task, the seconds from the click to the status line that the result is on
screen (regions already extracted, as after an upload), median and max over `--repeats`; the region extraction time
per model (uncached, the app's own timing); and the app process's resident memory (RSS) when idle after loading, and
after the runs. Consecutive actions differ (another question, another text list, greedy/beam alternating), so every
result changes the status line.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    from tests.app_browser import Page
    from tests.test_app import _free_port
    from vlhub.app import VlhubApp, demo_folders, launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--demo-dir", default="runs/demo")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    folders = args.model or demo_folders(args.demo_dir)
    app = VlhubApp.from_folders(folders, examples_dir=tempfile.mkdtemp(prefix="vlhub-bench-app-"))
    port = _free_port()
    served = launch(app, port=port, block=False)
    idle = rss_mib()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {__import__('torch').get_num_threads()}")
    print(f"app RSS idle after loading {len(app.models)} models: {idle:.0f} MiB")
    for name in app.models:
        seconds = []
        for example in app.examples:
            app._regions.clear()
            seconds.append(app.regions(name, example.path).seconds)
        found = []
        for example in app.examples:  # as for an upload: the extractor finds the boxes itself
            image = __import__("PIL.Image").Image.open(example.path).convert("RGB")
            start = time.perf_counter()
            app.models[name].pipeline.processor.regions_from_images([image])
            found.append(time.perf_counter() - start)
        print(
            f"region extraction ({name}'s extractor, {len(app.examples)} example images): with the world's boxes "
            f"median {statistics.median(seconds) * 1000:.0f} ms (max {max(seconds) * 1000:.0f}), boxes found by the "
            f"extractor median {statistics.median(found) * 1000:.0f} ms (max {max(found) * 1000:.0f})"
        )
    page = Page(f"http://127.0.0.1:{port}/")
    example = app.examples[0]
    rows = []
    try:
        for name, model in app.models.items():
            if page.driver.find_element("css selector", "#model input").get_attribute("value") != name:
                page.pick_model(name)
            page.status_after(lambda: page.upload(example.path)) if not rows else None
            page.wait_for(lambda: page.text("status").startswith("regions ready for " + name))
            times, beam_times = [], []
            if model.task == "vqa":
                page.tab("Ask")
                questions = [e.question for e in app.examples]
                for i in range(args.repeats):
                    page.fill("question", questions[i % len(questions)] + ("" if i % 2 else " "))
                    times.append(page.status_after(lambda: page.click("ask-button"))[1])
            elif model.task == "retrieval":
                page.tab("Rank")
                texts = list(example.labels) + ["two red circles.", "a small green diamond."]
                for i in range(args.repeats):
                    page.fill("texts", "\n".join(texts[: len(texts) - i % 2]))
                    times.append(page.status_after(lambda: page.click("rank-button"))[1])
            else:
                page.tab("Caption")
                for i in range(args.repeats):
                    label = "greedy" if i % 2 == 0 else "beam"
                    [radio] = [
                        b for b in page.driver.find_elements("css selector", "#decoding label") if b.text == label
                    ]
                    radio.click()
                    (times if label == "greedy" else beam_times).append(
                        page.status_after(lambda: page.click("caption-button"))[1]
                    )
            rows.append((name, model.task + (" (greedy)" if beam_times else ""), statistics.median(times), max(times)))
            if beam_times:
                rows.append((name, "captioning (beam 3)", statistics.median(beam_times), max(beam_times)))
    finally:
        page.close()
    print(f"{'model':24s} {'task':20s} {'click -> on screen, median':>27s} {'max':>8s}")
    for name, task, median, worst in rows:
        print(f"{name:24s} {task:20s} {median * 1000:24.0f} ms {worst * 1000:5.0f} ms")
    print(f"app RSS after the runs: {rss_mib():.0f} MiB")
    served.close()


if __name__ == "__main__":
    main()
