"""The public names of `shards`, in a module of their own: the package lists them (`__all__`, lazy `__getattr__`)
without importing `shards`, which needs `datasets` and `pyarrow`, and `shards.__all__` is this same list."""

SHARDS_EXPORTS = (
    "RegionStore",
    "RegionStoreWriter",
    "StoreLayout",
    "StoreLockedError",
    "StoreSourceMismatchError",
    "import_features",
    "recorded_source",
    "check_store_source",
    "stored_image_ids",
    "FLOAT16_MAX",
)
