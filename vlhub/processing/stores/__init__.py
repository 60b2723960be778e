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
    UniterLmdbReader,
    VilbertLmdbReader,
    VlpH5Reader,
    open_feature_file,
)
from .shards import RegionStore, RegionStoreWriter, StoreLayout


def import_features(reader, output, shard_size: int = 512, feature_dtype: str = "float32", progress: bool = True) -> int:
    """Copy every image of a reader (any `open_feature_file` reader, or a mapping id → RegionFeatures) into the
    vlhub store at `output`; images already there are skipped, so an interrupted import can be rerun. Returns
    the number of images written."""
    from tqdm.auto import tqdm

    written = 0
    with RegionStoreWriter(output, shard_size=shard_size, feature_dtype=feature_dtype) as writer:
        for image_id in tqdm(list(reader), desc="importing", unit="img", disable=not progress):
            if image_id not in writer.completed_ids:
                writer.add(image_id, reader[image_id])
                written += 1
    return written

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
    "FEATURE_FORMATS",
    "open_feature_file",
    "import_features",
]
