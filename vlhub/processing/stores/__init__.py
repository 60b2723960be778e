"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from.
"""

from .original import (
    BUTD_TSV_FIELDS,
    LXMERT_TSV_FIELDS,
    ButdTsvReader,
    FeatureFileError,
    NpzFolderReader,
    UniterLmdbReader,
    VilbertLmdbReader,
    VlpH5Reader,
)
from .shards import RegionStore, RegionStoreWriter, StoreLayout

__all__ = [
    "RegionStore",
    "RegionStoreWriter",
    "StoreLayout",
    "FeatureFileError",
    "ButdTsvReader",
    "UniterLmdbReader",
    "VilbertLmdbReader",
    "VlpH5Reader",
    "NpzFolderReader",
    "BUTD_TSV_FIELDS",
    "LXMERT_TSV_FIELDS",
]
