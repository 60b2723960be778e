"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from. The readers of
files only one architecture's release uses live with that architecture (its package in `vlhub.modeling` exports
the reader) and register their format by name; `open_feature_file(format, path)` opens any registered format.
"""

from . import original, shards
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
from .shards import (
    FLOAT16_MAX,
    RegionStore,
    RegionStoreWriter,
    StoreLayout,
    StoreLockedError,
    import_features,
    stored_image_ids,
)


# The names of both modules (each keeps its own list).
__all__ = [*shards.__all__, *original.__all__]


def __getattr__(name: str):
    # An architecture's reader that used to be importable from here: found through the format registry, with a
    # FutureWarning naming its home.
    reader = original.moved_reader(name)
    if reader is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return reader
