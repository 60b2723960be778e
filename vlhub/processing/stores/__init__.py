"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from.
"""

from .original import (
    BUTD_TSV_FIELDS,
    FEATURE_FORMATS,
    LXMERT_TSV_FIELDS,
    ButdTsvReader,
    FeatureFileError,
    NpzFolderReader,
    VlBertJsonReader,
    UniterLmdbReader,
    VilbertLmdbReader,
    VlpH5Reader,
    open_feature_file,
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


__all__ = [
    "RegionStore",
    "RegionStoreWriter",
    "StoreLayout",
    "StoreLockedError",
    "stored_image_ids",
    "FLOAT16_MAX",
    "FeatureFileError",
    "ButdTsvReader",
    "UniterLmdbReader",
    "VilbertLmdbReader",
    "VlpH5Reader",
    "NpzFolderReader",
    "VlBertJsonReader",
    "BUTD_TSV_FIELDS",
    "LXMERT_TSV_FIELDS",
    "FEATURE_FORMATS",
    "open_feature_file",
    "import_features",
]
