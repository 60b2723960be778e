"""Region feature stores: vlhub's own sharded store, and readers of the formats the original projects published.

Every reader returns `RegionFeatures`, so a model never needs to know where its regions came from.
"""

from .shards import RegionStore, RegionStoreWriter, StoreLayout

__all__ = ["RegionStore", "RegionStoreWriter", "StoreLayout"]
