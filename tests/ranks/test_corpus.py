"""The corpus loader on real gloo ranks: rank 0 alone builds the sample index (the others wait, then map it), each
rank reads only the rows of its (d, z) share, those rows equal the serial loader's on every grid (the global order
does not depend on the grid), and a token id beyond the vocabulary stops every rank with the same line."""
import numpy as np
import pytest

import axgrid
from axgrid.data.corpus import Corpus, DataSettings
from axgrid.driver import share_rows
from helpers.corpus import random_dataset

BATCH, MICRO = 8, 2


def rank_read(spec: str, paths: tuple, cache: str, vocab: int = 300) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        try:
            corpus = Corpus(DataSettings(paths, "90,10,0", cache), grid, seq=12, seed=5, vocab=vocab,
                            train_samples=3 * BATCH, valid_samples=BATCH)
        except SystemExit as e:
            return {"error": str(e)}
        rows = share_rows(BATCH, MICRO, grid)
        batches = [corpus.batch(step, BATCH, rows)[0].numpy() for step in range(3)]
        valid = corpus.valid_batch(0, BATCH, rows)[0].numpy()
        return {"rows": rows, "batches": batches, "valid": valid, "built": corpus.built_here,
                "zero": [r for r in range(BATCH) if r not in rows and not batches[0][r].any()]}
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec", ["1x1x2x2", "2x1x1x2"])
def test_rank0_builds_each_rank_reads_its_share_in_the_global_order(ranks, tmp_path, spec):
    random_dataset(tmp_path / "a", docs=150, seed=1)
    random_dataset(tmp_path / "b", docs=90, seed=2)
    paths = ("0.6", str(tmp_path / "a"), "0.4", str(tmp_path / "b"))
    serial = Corpus(DataSettings(paths, "90,10,0", str(tmp_path / "serial")), None, seq=12, seed=5, vocab=300,
                    train_samples=3 * BATCH, valid_samples=BATCH)
    out = ranks(4, rank_read, spec, paths, str(tmp_path / "cache"))
    assert [r["built"] for r in out] == [True, False, False, False]            # built once, by rank 0
    covered = set()
    for r in out:
        covered |= set(r["rows"])
        assert len(r["rows"]) == (BATCH // 4 if spec == "1x1x2x2" else BATCH // 2)
        assert r["zero"] == [x for x in range(BATCH) if x not in r["rows"]]     # nothing else was read
        for step in range(3):
            want = serial.batch(step, BATCH)[0].numpy()
            assert np.array_equal(r["batches"][step][r["rows"]], want[r["rows"]])
        assert np.array_equal(r["valid"][r["rows"]], serial.valid_batch(0, BATCH)[0].numpy()[r["rows"]])
    assert covered == set(range(BATCH))
    again = ranks(4, rank_read, spec, paths, str(tmp_path / "cache"))
    assert not any(r["built"] for r in again)                                  # the cache is reused


def test_a_token_beyond_the_vocabulary_stops_every_rank(ranks, tmp_path):
    random_dataset(tmp_path / "a", docs=60)
    out = ranks(2, rank_read, "1x1x1x2", (str(tmp_path / "a"),), str(tmp_path / "c"), 100)
    msgs = {r["error"] for r in out}
    assert len(msgs) == 1 and "token id 299 >= the model's vocabulary 100" in msgs.pop()


def rank_open(paths: tuple, cache: str, per_rank: bool, io_timeout_s: float) -> dict:
    """Open a corpus with the index wait bounded by ``io_timeout_s``; ``per_rank``: each rank its own cache folder
    (a folder not shared by the ranks, as a node-local /tmp is). The error line and the seconds it took."""
    import time
    grid = axgrid.init("1x1x1x2", config=axgrid.RuntimeConfig(timeout_s=60, io_timeout_s=io_timeout_s))
    t0 = time.monotonic()
    try:
        Corpus(DataSettings(paths, "90,10,0", f"{cache}{grid.rank}" if per_rank else cache), grid, seq=12, seed=5,
               vocab=300, train_samples=3 * BATCH)
        return {"error": None, "s": time.monotonic() - t0}
    except SystemExit as e:
        return {"error": str(e), "s": time.monotonic() - t0}
    finally:
        grid.destroy()


def test_a_cache_rank0_cannot_write_stops_every_rank_at_once(ranks, tmp_path):
    """Rank 0 can write neither the index nor a .failed marker (a read-only data folder: as root, whom chmod does
    not stop, a cache path under a file): every rank stops with one line naming --data-cache, without waiting."""
    random_dataset(tmp_path / "a", docs=60)
    (tmp_path / "file").write_text("")
    out = ranks(2, rank_open, (str(tmp_path / "a"),), str(tmp_path / "file" / "cache"), False, 600.0)
    for r in out:
        assert r["error"].startswith(f"rank 0 cannot write the sample index to {tmp_path / 'file' / 'cache'}")
        assert "--data-cache" in r["error"] and "\n" not in r["error"] and r["s"] < 60


def test_a_cache_not_shared_by_the_ranks_ends_within_the_bound(ranks, tmp_path):
    """Each rank its own cache: rank 1 never sees rank 0's marker; after 0.8 x io_timeout_s it stops with one line
    naming the marker, rank 0 and --data-cache, and rank 0 with the line that one rank cannot see the index."""
    random_dataset(tmp_path / "a", docs=60)
    out = ranks(2, rank_open, (str(tmp_path / "a"),), str(tmp_path / "cache"), True, 4.0)   # rank 1 waits 3.2 s
    first, second = out
    assert second["error"].startswith(f"rank 1: {tmp_path / 'cache1'}/.build-") and "did not appear" in \
        second["error"] and "rank 0" in second["error"] and "--data-cache" in second["error"]
    assert first["error"] == f"1 rank(s) cannot see the sample index in {tmp_path / 'cache0'}: pass --data-cache a " \
                             f"folder every rank shares"
    assert all("\n" not in r["error"] and r["s"] < 40 for r in out)
