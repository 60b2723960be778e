"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from. The readers of
files only one architecture's release uses live with that architecture (its package in `vlhub.modeling` exports
the reader) and register their format by name; `open_feature_file(format, path)` opens any registered format.

The sharded store (`shards`) needs `datasets` and `pyarrow`, so its names are imported on first access: `import vlhub`
registers the architectures' feature formats here without loading either (`tests/test_package_import.py`).
"""

from . import original
from ._exports import SHARDS_EXPORTS
from .original import (
    BUTD_TSV_FIELDS,
    FEATURE_FORMATS,
    LXMERT_TSV_FIELDS,
    ButdTsvReader,
    FeatureFileError,
    FeatureReader,
    FolderReader,
    LmdbReader,
    NpzFolderReader,
    butd_record,
    feature_array,
    open_feature_file,
    register_feature_format,
)

# The names of both modules (each keeps its own list; `shards`' is listed without importing it).
__all__ = [*SHARDS_EXPORTS, *original.__all__]


def __getattr__(name: str):
    import importlib

    if name == "shards" or name in SHARDS_EXPORTS:
        shards = importlib.import_module(f"{__name__}.shards")
        return shards if name == "shards" else getattr(shards, name)
    # An architecture's reader that used to be importable from here: found through the format registry, with a
    # FutureWarning naming its home.
    reader = original.moved_reader(name)
    if reader is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return reader


def __dir__():
    return sorted({*globals(), *__all__, "shards"})
