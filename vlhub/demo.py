"""The README's main job on the embedded default, end to end and offline:

    python -m vlhub.demo [--model_type uniter] [--output_dir runs/demo] [--pretrain_steps 600] ...

Everything is written under `<output_dir>/<model_type>/` (`runs/demo/uniter/` by default), so the demos of several
architectures live side by side: `uniter-shapes` (pre-trained), `uniter-shapes-vqa`, `uniter-shapes-itr`,
`vlp-shapes` and `vlp-shapes-captioning` (the captioner of an encoder), `pictures/`. Each finished step leaves
`demo_step.json` (its settings and scores) in its folder: running the demo again reuses the steps finished with the
same settings (and the same model before them) and runs the rest; `--overwrite_output_dir` starts every step over.

For the chosen architecture (UNITER by default) it runs the steps of `demo_plan(model_type)`:

1. pre-training a tiny model on the shapes world (`pretrain.py`'s code; the architecture's objective mix for a model
   trained from scratch, `Architecture.from_scratch_objectives`, where it declares one, else the original's),
2. VQA: fine-tuning, accuracy on held-out test images against the majority-answer baseline, and answers to held-out
   questions through `pipeline("visual-question-answering")`,
3. retrieval: fine-tuning for image-text retrieval, recall@1/5/10 both ways on held-out images next to chance, and a
   handful of held-out captions ranked for one image through `pipeline("image-text-retrieval")`,
4. captioning: fine-tuning for captioning, the COCO caption metrics against the most-frequent-caption baseline, and
   captions of held-out images through `pipeline("image-captioning")`. An architecture that cannot caption (an
   encoder such as UNITER) hands this step to a tiny Unified VLP (`--caption_steps 0` skips it);

each step an architecture cannot do is skipped with a one-line reason. It writes one PNG per shown example (the
image with its regions, the question and answer, the top-ranked captions, the generated caption) and ends with one
table: task, metric, vlhub result, baseline.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .evaluation.captions import CAPTION_METRICS
from .utils.files import atomic_write_json

if TYPE_CHECKING:
    from .training.loop import TrainResult

__all__ = ["main", "DemoStep", "demo_plan", "DEMO_STEPS", "summary_table", "task_unavailable_reason"]

DEMO_STEPS: tuple[str, ...] = ("pretraining", "vqa", "retrieval", "captioning")
CAPTIONER = "unified_vlp"  # captions for architectures that cannot
DEMO_STEP_FILE = "demo_step.json"  # in a step's folder once it finished: its settings, its scores, a run id


@dataclass(frozen=True)
class DemoStep:
    """One step of the demo for one architecture: `skip` is None when it runs, else the one-line reason."""

    name: str
    skip: str | None = None


def _first_sentence(text: str) -> str:
    return text.split(";")[0].split(". ")[0].rstrip(".")


def demo_plan(model_type: str) -> list[DemoStep]:
    """The demo's steps for `model_type`, in order, each either run or skipped with a one-line reason: derived from
    what the architecture declares (pre-training objectives, task heads, a caption training objective)."""
    from .registry import get_architecture

    architecture = get_architecture(model_type)
    if not architecture.pretraining_objectives():
        why = f"{architecture.name} declares no pre-training objectives for vlhub's training loop yet"
        plan = [DemoStep("pretraining", why)]
        return plan + [
            DemoStep(task, "needs the pre-trained model (pre-training is skipped)") for task in DEMO_STEPS[1:]
        ]
    return [DemoStep("pretraining")] + [
        DemoStep(task, task_unavailable_reason(model_type, task)) for task in DEMO_STEPS[1:]
    ]


def task_unavailable_reason(model_type: str, task: str, for_training: bool = True) -> str | None:
    """Why `model_type` cannot do `task` ("vqa", "retrieval", "captioning"), in one line, or None when it can: it has
    no head for it (the architecture's declared reason), or (`for_training`) no objective to fine-tune it with. The
    demo skips such a step with this line; `vlhub app` disables the task with it."""
    from .registry import get_architecture

    architecture = get_architecture(model_type)
    name = architecture.name
    if not architecture.has_task(task):
        why = architecture.unsupported_tasks.get(task)
        if why is None:
            why = (
                f"{name} is an encoder without a text decoder: it cannot caption"
                if task == "captioning"
                else f"{name} has no {task} head"
            )
        return _first_sentence(why)
    if for_training and task == "captioning" and task not in architecture.finetuning_objectives:
        return f"{name} declares no caption training objective yet"
    return None


def summary_table(rows: list[tuple[str, str, str, str]]) -> str:
    """`rows` of (task, metric, vlhub result, baseline) as an aligned text table with a header."""
    header = ("task", "metric", "vlhub", "baseline")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from .registry import architectures

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_type", default="uniter", help="The architecture (default uniter).")
    parser.add_argument("--output_dir", default="runs/demo", help="The demo writes under <output_dir>/<model_type>/.")
    parser.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="Start every step over (without it, steps finished earlier with the same settings are reused).",
    )
    parser.add_argument("--pretrain_steps", type=int, default=600)
    parser.add_argument(
        "--pretrain_objectives",
        default=None,
        help="name:ratio,... (pretrain.py's --objectives). "
        "Default: the architecture's mix for training from scratch (UNITER: itc:1,itm:1), else its "
        "original mix.",
    )
    parser.add_argument("--finetune_steps", type=int, default=600, help="VQA fine-tuning steps (0: none).")
    parser.add_argument("--retrieval_steps", type=int, default=100, help="Retrieval fine-tuning steps (0: none).")
    parser.add_argument("--num_examples", type=int, default=4, help="Held-out examples to show (and draw).")
    parser.add_argument(
        "--max_eval_samples",
        type=int,
        default=0,
        help="Score every step on at most N held-out examples (captioning: images) per split (default 0: all).",
    )
    parser.add_argument(
        "--gallery_images", type=int, default=50, help="Retrieval: the held-out gallery's size (default 50)."
    )
    parser.add_argument(
        "--caption_steps",
        type=int,
        default=500,
        help="Captioning: pre-training steps of the "
        "captioner (when the architecture cannot caption), then as many captioning fine-tuning steps "
        "(0: no captioning).",
    )
    parser.add_argument(
        "--caption_metrics",
        nargs="+",
        default=None,
        choices=CAPTION_METRICS,
        help="Captioning: the COCO caption metrics to report (finetune.py's --caption_metrics; default all). "
        "METEOR runs a Java helper and takes most of a short run's evaluation time.",
    )
    parser.add_argument(
        "--no_pack",
        action="store_true",
        help="The pipelines keep the plain linear layers (default: packed for float32 CPU inference where that "
        "pays, vlhub.modeling.packed_linear.packing_pays). Where bf16 measured fast, the VQA and retrieval pipelines "
        "run in bfloat16 either way (docs/performance.md).",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_eval_samples < 0:
        parser.error(f"--max_eval_samples must be 0 (all) or more, got {args.max_eval_samples}")
    if args.gallery_images < 1:
        parser.error(f"--gallery_images must be at least 1, got {args.gallery_images}")
    if args.pretrain_steps < 1:
        parser.error(
            f"--pretrain_steps must be at least 1 (every later step starts from it), got {args.pretrain_steps}"
        )
    for name in ("finetune_steps", "retrieval_steps", "caption_steps"):
        if vars(args)[name] < 0:
            parser.error(f"--{name} must be 0 (none) or more, got {vars(args)[name]}")
    known = sorted(architectures())
    if args.model_type not in known:
        parser.error(f"--model_type {args.model_type!r} is not a vlhub architecture; known: {', '.join(known)}")
    return Demo(args).run()


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        from .registry import get_architecture
        from .training.data import shapes_region_store, shapes_world

        self.args = args
        self.pipeline_packing = False if args.no_pack else None  # None: where packing pays
        self.out = Path(args.output_dir) / args.model_type
        self.architecture = get_architecture(args.model_type)
        self.prefix = args.model_type.replace("_", "-")
        self.common = ["--seed", str(args.seed), "--logging_steps", "25"]
        if args.max_eval_samples:
            self.common += ["--max_eval_samples", str(args.max_eval_samples)]
        self.world = shapes_world(seed=0)
        self.store = shapes_region_store(self.world)
        self.scores: dict = {}
        self.table: list[tuple[str, str, str, str]] = []
        test_images = self.world.images()["test"]
        stride = max(1, len(test_images) // max(args.num_examples, 1))
        self.shown = [test_images[i]["image_id"] for i in range(0, stride * args.num_examples, stride)]
        self.pictures: dict[str, list[tuple[str, list[str]]]] = {image_id: [] for image_id in self.shown}
        # The first shown image as a PNG file: each pipeline is also run on it, regions found by its extractor.
        self.raw_image = self.out / "images" / f"{self.shown[0]}.png"
        self.raw_image.parent.mkdir(parents=True, exist_ok=True)
        test_images[0]["image"].save(self.raw_image)  # self.shown[0] is the first test image

    def run(self) -> dict:
        start = time.time()
        plan = demo_plan(self.args.model_type)
        steps = {step.name: step for step in plan}
        for name, option in (("vqa", "finetune_steps"), ("retrieval", "retrieval_steps")):
            if vars(self.args)[option] == 0 and steps[name].skip is None:
                steps[name] = DemoStep(name, f"--{option} 0")
        print(f"== vlhub demo: {self.architecture.name} on the shapes world", flush=True)
        for step in steps.values():
            print(f"   {step.name:12s} {'runs' if step.skip is None else 'skipped: ' + step.skip}")
        if steps["pretraining"].skip is None:
            self.pretrain()
        if steps["vqa"].skip is None:
            self.vqa()
        if steps["retrieval"].skip is None:
            self.retrieval()
        if self.args.caption_steps > 0:
            if steps["captioning"].skip is None:
                self.captioning(self.out / f"{self.prefix}-shapes", self.architecture.name)
            elif steps["pretraining"].skip is None and self.args.model_type != CAPTIONER:
                print(f"== captioning: {steps['captioning'].skip}; a tiny Unified VLP captions instead", flush=True)
                self.captioning(None, "Unified VLP")
        self.draw()
        print("== summary (held-out shapes-world images)")
        print(summary_table(self.table) if self.table else "   (no step ran)")
        print(f"done in {time.time() - start:.0f} s")
        return self.scores

    # ------------------------------------------------------------------------------------------------- steps
    def run_step(
        self, main: Callable[[list[str]], TrainResult], folder: Path, model_folder: Path | None, settings: list[str]
    ) -> dict:
        """Train into `folder` with `main` (pretrain_main or finetune_main) and `settings`, starting from the model in
        `model_folder` (None: from scratch), unless the step finished there earlier with the same settings from the
        same model (its `DEMO_STEP_FILE` says so): then its recorded scores are returned. Returns the scores."""
        marker = folder / DEMO_STEP_FILE
        source = None if model_folder is None else json.loads((model_folder / DEMO_STEP_FILE).read_text())["run_id"]
        if marker.is_file() and not self.args.overwrite_output_dir:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
            if recorded["settings"] == settings and recorded["source_run_id"] == source:
                print(
                    f"   {folder}: finished earlier with these settings, reused (--overwrite_output_dir starts over)",
                    flush=True,
                )
                return recorded["eval_results"]
            if recorded["settings"] != settings:
                raise SystemExit(
                    f"vlhub demo: {folder} holds this step run with other settings "
                    f"({' '.join(recorded['settings'])}); pass --overwrite_output_dir to start over, or "
                    "choose another --output_dir"
                )
            print(f"   {folder}: the model before this step was trained anew; this step starts over", flush=True)
        redo = marker.is_file() or self.args.overwrite_output_dir
        marker.unlink(missing_ok=True)  # a step stopped half-way must not read as finished
        result = main(
            [
                *(["--model_name_or_path", str(model_folder)] if model_folder else []),
                "--output_dir",
                str(folder),
                *(["--overwrite_output_dir"] if redo else []),
                *settings,
            ]
        )
        atomic_write_json(
            marker,
            {
                "settings": settings,
                "source_run_id": source,
                "run_id": uuid.uuid4().hex,
                "eval_results": result.eval_results,
            },
        )
        return result.eval_results

    def pretrain(self) -> None:
        from .training.cli import pretrain_main

        args, architecture = self.args, self.architecture
        objectives = args.pretrain_objectives
        if objectives is None and architecture.from_scratch_objectives:
            objectives = ",".join(f"{n}:{r:g}" for n, r in architecture.from_scratch_objectives.items())
            why = f"objectives {objectives}, {architecture.name}'s mix for training from scratch"
        else:
            why = f"objectives {objectives}" if objectives else "the original objective mix"
        print(
            f"== pre-training a tiny {architecture.name} on the shapes world ({args.pretrain_steps} steps, {why})",
            flush=True,
        )
        self.run_step(
            pretrain_main,
            self.out / f"{self.prefix}-shapes",
            None,
            [
                "--model_type",
                args.model_type,
                "--config_name",
                "tiny",
                "--max_steps",
                str(args.pretrain_steps),
                *(["--objectives", objectives] if objectives else []),
                *self.common,
            ],
        )

    def vqa(self) -> None:
        from transformers import pipeline

        from .training.cli import finetune_main

        args, name, world, store = self.args, self.architecture.name, self.world, self.store
        folder = self.out / f"{self.prefix}-shapes-vqa"
        print(
            f"== VQA: fine-tuning ({args.finetune_steps} steps), accuracy (official rule) on held-out images",
            flush=True,
        )
        scores = self.run_step(
            finetune_main,
            folder,
            self.out / f"{self.prefix}-shapes",
            ["--max_steps", str(args.finetune_steps), *self.common],
        )
        self.scores.update(scores)
        for split in ("validation", "test"):
            print(
                f"   {split:10s}: fine-tuned {name} {scores[f'{split}_vqa_accuracy']:.4f}   "
                f"majority-answer baseline {scores[f'{split}_majority_baseline']:.4f}"
            )
        print(f"   (recorded in {folder / 'README.md'})")
        self.table.append(
            (
                "VQA",
                "accuracy (test)",
                f"{scores['test_vqa_accuracy']:.3f}",
                f"{scores['test_majority_baseline']:.3f} (majority answer)",
            )
        )
        print("   answering held-out questions with pipeline('visual-question-answering')", flush=True)
        vqa = pipeline("visual-question-answering", model=str(folder), pack_linear_weights=self.pipeline_packing)
        test = world.vqa()["test"]
        first_question = {}
        for row in test:
            first_question.setdefault(row["image_id"], row)
        for image_id in self.shown:
            row = first_question[image_id]
            best = vqa(image=store[image_id], question=row["question"], top_k=1)[0]
            print(
                f"   {image_id}  Q: {row['question']:45s} A: {best['answer']:8s} ({best['score']:.2f})   "
                f"annotators: {row['multiple_choice_answer']}"
            )
            self.pictures[image_id].append(
                (
                    "VQA",
                    [
                        f"Q: {row['question']}",
                        f"A: {best['answer']} ({best['score']:.2f}); annotators: {row['multiple_choice_answer']}",
                    ],
                )
            )
        question = first_question[self.shown[0]]["question"]
        best = vqa(image=str(self.raw_image), question=question, top_k=1)[0]
        print(f"   {self._from_file}: Q: {question}  A: {best['answer']} ({best['score']:.2f})")

    @property
    def _from_file(self) -> str:
        return f"from the image file {self.raw_image} (regions found by the processor's extractor)"

    def retrieval(self) -> None:
        from transformers import pipeline

        from .evaluation import retrieval_chance
        from .training.cli import finetune_main

        args, name = self.args, self.architecture.name
        folder = self.out / f"{self.prefix}-shapes-itr"
        print(
            f"== retrieval: fine-tuning ({args.retrieval_steps} steps, the head's original ranking loss), "
            "recall@K on held-out images",
            flush=True,
        )
        scores = self.run_step(
            finetune_main,
            folder,
            self.out / f"{self.prefix}-shapes",
            [
                "--task",
                "retrieval",
                "--max_steps",
                str(args.retrieval_steps),
                "--per_device_train_batch_size",
                "8",
                "--num_sampled_negatives",
                "7",
                "--num_hard_negatives",
                "2",
                "--max_gallery_images",
                str(args.gallery_images),
                *self.common,
            ],
        )
        self.scores.update({f"retrieval_{k}": v for k, v in scores.items()})
        captions = self.world.captions()["validation"]
        gallery = sorted(set(captions["image_id"]))[: args.gallery_images]
        index = {image_id: k for k, image_id in enumerate(gallery)}
        chance = retrieval_chance([index[i] for i in captions["image_id"] if i in index], len(gallery))
        for direction in ("text_to_image", "image_to_text"):
            found = " ".join(f"R@{k} {scores[f'{direction}_recall@{k}']:.3f}" for k in (1, 5, 10))
            base = " ".join(f"R@{k} {chance[f'{direction}_recall@{k}']:.3f}" for k in (1, 5, 10))
            label = direction.replace("_to_", " -> ").replace("_", " ")
            print(f"   {label:14s}: fine-tuned {name} {found}   chance {base}")
            self.table.append(
                (
                    "retrieval",
                    f"{label} R@1/5/10 ({len(gallery)} images)",
                    "/".join(f"{scores[f'{direction}_recall@{k}']:.2f}" for k in (1, 5, 10)),
                    "/".join(f"{chance[f'{direction}_recall@{k}']:.2f}" for k in (1, 5, 10)) + " (chance)",
                )
            )
        retrieval = pipeline("image-text-retrieval", model=str(folder), pack_linear_weights=self.pipeline_packing)
        test = self.world.captions()["test"]
        own = {}
        for image_id, caption in zip(test["image_id"], test["caption"]):
            own.setdefault(image_id, caption)
        candidates = [own[i] for i in self.shown] + [own[i] for i in list(own)[1:8:2] if i not in self.shown]
        print(
            f"   ranking {len(candidates)} held-out captions for each shown image with "
            "pipeline('image-text-retrieval') (* = the image's own caption)",
            flush=True,
        )
        for n, image_id in enumerate(self.shown):
            ranked = retrieval(image=self.store[image_id], texts=candidates)
            lines = [f"{r['score']:.2f} {'*' if r['text'] == own[image_id] else ' '} {r['text']}" for r in ranked[:3]]
            if n == 0:
                print(f"   {image_id}:")
                for r in ranked:
                    print(f"      {r['score']:.2f} {'*' if r['text'] == own[image_id] else ' '} {r['text']}")
            self.pictures[image_id].append(("top-ranked captions (* = its own)", lines))
        best = retrieval(image=str(self.raw_image), texts=candidates)[0]
        print(f"   {self._from_file}: top caption {best['text']!r} ({best['score']:.2f})")

    def captioning(self, pretrained: Path | None, name: str) -> None:
        from transformers import pipeline

        from .training.captioning import references_by_image
        from .training.cli import finetune_main, pretrain_main

        steps = str(self.args.caption_steps)
        if pretrained is None:
            pretrained = self.out / "vlp-shapes"
            print(f"   pre-training a tiny Unified VLP ({steps} steps)", flush=True)
            self.run_step(
                pretrain_main,
                pretrained,
                None,
                ["--model_type", CAPTIONER, "--config_name", "tiny", "--max_steps", steps, *self.common],
            )
        folder = pretrained.with_name(pretrained.name + "-captioning")
        metrics = ["--caption_metrics", *self.args.caption_metrics] if self.args.caption_metrics else []
        print(f"== captioning: fine-tuning {name} ({steps} steps), COCO caption metrics on held-out images", flush=True)
        scores = self.run_step(
            finetune_main, folder, pretrained, ["--task", "captioning", "--max_steps", steps, *metrics, *self.common]
        )
        self.scores.update({f"captioning_{k}": v for k, v in scores.items()})
        reported = [
            k[len("test_") :]
            for k in scores
            if k.startswith("test_") and "baseline" not in k and not k.endswith("num_images")
        ]
        for metric in reported:
            print(
                f"   {metric:8s}: fine-tuned {name} {scores[f'test_{metric}']:.4f}   "
                f"most-frequent-caption baseline {scores[f'test_baseline_{metric}']:.4f}"
            )
        if "CIDEr" in reported:
            self.table.append(
                (
                    f"captioning ({name})",
                    "CIDEr-D (test)",
                    f"{scores['test_CIDEr']:.3f}",
                    f"{scores['test_baseline_CIDEr']:.3f} (most frequent caption)",
                )
            )
        captioner = pipeline("image-captioning", model=str(folder), pack_linear_weights=self.pipeline_packing)
        test = self.world.captions()["test"]
        references = references_by_image(zip(test["image_id"], test["caption"]))
        for image_id in self.shown:
            caption = captioner(self.store[image_id])[0]["generated_text"]
            print(f"   {image_id}  caption: {caption:50s} references: {' | '.join(references[image_id][:2])}")
            self.pictures[image_id].append((f"generated caption ({name})", [caption]))
        print(f"   {self._from_file}: caption {captioner(str(self.raw_image))[0]['generated_text']!r}")

    def draw(self) -> None:
        from .demo_pictures import ExamplePicture, write_example_picture

        if not any(self.pictures.values()):
            return
        folder = self.out / "pictures"
        folder.mkdir(parents=True, exist_ok=True)
        images = {row["image_id"]: row for row in self.world.images()["test"] if row["image_id"] in self.pictures}
        written = []
        for image_id, sections in self.pictures.items():
            row = images[image_id]
            written.append(
                write_example_picture(
                    folder / f"{image_id}.png",
                    ExamplePicture(
                        image=row["image"],
                        boxes=row["boxes"],
                        title=f"{image_id} (held-out test image)",
                        region_labels=row["labels"],
                        sections=sections,
                    ),
                )
            )
        print(f"== pictures of the shown examples: {', '.join(written)}")


if __name__ == "__main__":
    main()
