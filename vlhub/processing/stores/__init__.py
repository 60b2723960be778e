"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from.
"""

from . import original, shards
from .original import (
    BUTD_TSV_FIELDS,
    FEATURE_FORMATS,
    LXMERT_TSV_FIELDS,
    ButdTsvReader,
    FeatureFileError,
    FolderReader,
    NpzFolderReader,
    UniterLmdbReader,
    VilbertLmdbReader,
    VlpH5Reader,
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
