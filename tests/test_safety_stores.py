"""A region store shared by several writers, and a writer killed mid-shard: nothing lost, nothing doubled."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vlhub.processing.stores import RegionStore, RegionStoreWriter
from vlhub.processing.stores.shards import StoreLockedError

from .helpers import random_regions

REPO = Path(__file__).resolve().parents[1]

# A child that stores two images, then starts a second shard and is killed while half of it is on disk.
KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from vlhub.processing.stores import RegionStoreWriter
    from tests.helpers import random_regions

    store, ready = Path(sys.argv[1]), Path(sys.argv[2])
    writer = RegionStoreWriter(store, shard_size=2)
    writer.add("a", random_regions(3, 8, seed=1))
    writer.add("b", random_regions(3, 8, seed=2))          # shard 0 is complete
    real_write_shard = RegionStoreWriter._write_shard

    def half_then_hang(self, temporary, pending):
        real_write_shard(self, temporary, pending)
        data = temporary.read_bytes()
        temporary.write_bytes(data[: len(data) // 2])       # the disk holds half the shard ...
        ready.write_text("half written")
        time.sleep(600)                                    # ... when SIGKILL arrives

    RegionStoreWriter._write_shard = half_then_hang
    writer.add("c", random_regions(3, 8, seed=3))
    writer.add("d", random_regions(3, 8, seed=4))
""")


# A new interpreter killed mid-shard (~4.5 s, mostly its imports): the full suite's; the fast loop keeps the cheaper
# tests of the same store guarantees (a leftover shard removed by the next writer, a second writer refused).
@pytest.mark.slow
def test_a_writer_killed_mid_shard_loses_only_its_unfinished_shard(tmp_path, caplog):
    store, ready = tmp_path / "store", tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(store), str(ready)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None, "the writer process ended before it was killed"
            assert time.monotonic() < deadline, "the writer never reached its second shard"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    leftovers = list(store.glob(".shard-p00000-00001.arrow.*.tmp"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # really half a file
    assert RegionStore(store).ids == ["a", "b"]  # readers never see it

    # The kernel released the dead writer's lock: a new writer of the same series opens, removes the leftover
    # with a warning and stores the lost images again.
    with caplog.at_level(logging.WARNING, logger="vlhub.processing.stores.shards"):
        writer = RegionStoreWriter(store, shard_size=2)
    assert "interrupted writer" in caplog.text and leftovers[0].name in caplog.text
    assert not leftovers[0].exists()
    with writer:
        assert writer.completed_ids == {"a", "b"}
        writer.add("c", random_regions(3, 8, seed=3))
        writer.add("d", random_regions(3, 8, seed=4))
    assert sorted(RegionStore(store).ids) == ["a", "b", "c", "d"]


def test_a_second_writer_of_one_series_is_refused(tmp_path):
    first = RegionStoreWriter(tmp_path, shard_size=2)
    with pytest.raises(StoreLockedError, match=f"process id {os.getpid()}.*series p00000"):
        RegionStoreWriter(tmp_path, shard_size=2)
    with RegionStoreWriter(tmp_path, shard_size=2, process_index=1) as other:  # another series is fine
        other.add("x", random_regions(2, 8))
    first.add("a", random_regions(2, 8))
    first.close()
    with RegionStoreWriter(tmp_path, shard_size=2) as again:  # released on close
        again.add("b", random_regions(2, 8))
    assert sorted(RegionStore(tmp_path).ids) == ["a", "b", "x"]
    assert [p.name for p in RegionStore(tmp_path).shard_files] == [
        "shard-p00000-00000.arrow",
        "shard-p00000-00001.arrow",
        "shard-p00001-00000.arrow",
    ]


def test_an_id_another_process_stored_is_refused_when_written(tmp_path):
    zero = RegionStoreWriter(tmp_path, shard_size=3, process_index=0)
    one = RegionStoreWriter(tmp_path, shard_size=3, process_index=1)
    zero.add("shared", random_regions(2, 8, seed=0))
    one.add("mine", random_regions(2, 8, seed=1))
    one.add("shared", random_regions(2, 8, seed=2))  # both queued it; neither has published it yet
    zero.close()
    with pytest.raises(ValueError, match="already in the store"):  # once published, add refuses it at once
        one.add("shared", random_regions(2, 8, seed=2))
    with pytest.raises(ValueError, match=r"\['shared'\].*refused"):
        one.close()
    store = RegionStore(tmp_path)  # opens: no id is stored twice
    assert sorted(store.ids) == ["mine", "shared"]
    assert store["shared"].features.tolist() == random_regions(2, 8, seed=0).features.tolist()


def test_writers_racing_for_the_first_layout_agree_on_one(tmp_path):
    narrow = RegionStoreWriter(tmp_path, process_index=0)
    wide = RegionStoreWriter(tmp_path, process_index=1)  # opened before any store.json existed
    narrow.add("a", random_regions(2, 8))
    with pytest.raises(ValueError, match="do not match this store's layout"):
        wide.add("b", random_regions(2, 16))
    narrow.close()
    wide.close()
    assert RegionStore(tmp_path).layout.feature_dim == 8


def test_a_shard_renamed_but_never_indexed_is_removed_by_the_next_writer(tmp_path, caplog):
    with RegionStoreWriter(tmp_path, shard_size=1) as writer:
        writer.add("a", random_regions(2, 8))
    # As if a writer had been killed between renaming its next shard into place and indexing it.
    (tmp_path / "shard-p00000-00001.arrow").write_bytes((tmp_path / "shard-p00000-00000.arrow").read_bytes())
    assert RegionStore(tmp_path).ids == ["a"]
    assert [p.name for p in RegionStore(tmp_path).shard_files] == ["shard-p00000-00000.arrow"]
    with caplog.at_level(logging.WARNING, logger="vlhub.processing.stores.shards"):
        with RegionStoreWriter(tmp_path, shard_size=1) as writer:
            writer.add("b", random_regions(2, 8, seed=1))
    assert "never indexed" in caplog.text
    assert sorted(RegionStore(tmp_path).ids) == ["a", "b"]
    assert len(RegionStore(tmp_path).dataset) == 2
