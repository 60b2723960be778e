"""vlhub's browser app: point at an image and see the regions a model sees, its answers, captions and rankings.

    vlhub app [--model FOLDER ...]      (or python -m vlhub.app; needs `pip install 'vlhub[app]'`)

`core` (no Gradio) loads folders into the pipelines and holds the handlers; `ui` is the Gradio page; `cli` the
command. `import vlhub` does not import this package, and this package imports Gradio only for the page.
"""

from .core import AppInputError, AppModel, VlhubApp, demo_folders, example_images, load_app_model

__all__ = [
    "AppInputError",
    "AppModel",
    "VlhubApp",
    "demo_folders",
    "example_images",
    "load_app_model",
    "build_app",
    "launch",
]


def __getattr__(name: str):
    if name in ("build_app", "launch"):
        from . import ui

        return getattr(ui, name)
    raise AttributeError(f"module 'vlhub.app' has no attribute {name!r}")
