"""axgrid.data's indexed format, split, blend and GPT samples, without ranks: the writer and reader round-trip
(several sequences per document, every dtype by vocabulary size, lengths spilled to disk), bad files are refused
with one line naming them, samples are the seq+1-token windows of each epoch's shuffled document stream, the
cached index is built once and reused, and blends realise their weights."""
import os

import numpy as np
import pytest

from axgrid.data.blend import ROUND, Blend, parse_blend, quotas
from axgrid.data.corpus import Corpus, DataSettings, split_tokens
from axgrid.data.indexed import DataError, IndexedTokens, IndexedWriter, token_dtype
from axgrid.data.samples import GPTSamples, parse_split, split_documents
from helpers.corpus import random_dataset


def test_round_trip_with_several_sequences_per_document_and_spilled_lengths(tmp_path, monkeypatch):
    import axgrid.data.indexed as indexed
    monkeypatch.setattr(indexed._Spill.__init__, "__defaults__", (7,))     # spill every 7 lengths
    docs = random_dataset(tmp_path / "d", docs=40, sequences_per_doc=3)
    data = IndexedTokens(tmp_path / "d")
    assert data.documents == 40 and len(data) == 120 and data.dtype == np.uint16
    assert data.doc_index.tolist() == list(range(0, 121, 3))
    for d, want in enumerate(docs):
        got = np.concatenate([data.tokens(s) for s in data.doc_sequences(d, d + 1)])
        assert np.array_equal(got, want)
    assert data.max_token() == max(int(d.max()) for d in docs if d.size)
    assert data.total_tokens == sum(d.size for d in docs)


@pytest.mark.parametrize("vocab, dtype", [(256, np.uint8), (257, np.uint16), (65536, np.uint16), (65537, np.int32)])
def test_dtype_by_vocabulary(tmp_path, vocab, dtype):
    assert token_dtype(vocab) == dtype
    with IndexedWriter(tmp_path / "v", token_dtype(vocab)) as w:
        w.add(np.array([0, vocab - 1]))
    data = IndexedTokens(tmp_path / "v")
    assert data.dtype == dtype and data.tokens(0).tolist() == [0, vocab - 1]


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="do not fit uint8"):
        with IndexedWriter(tmp_path / "x", np.uint8) as w:
            w.add(np.array([1, 2]))
            w.add(np.array([300]))
    assert os.listdir(tmp_path) == []


def test_bad_files_are_refused_with_one_line(tmp_path):
    random_dataset(tmp_path / "d", docs=10)
    for suffix in (".idx", ".bin"):
        os.rename(tmp_path / f"d{suffix}", tmp_path / "moved")
        with pytest.raises(DataError, match=rf"d\{suffix} does not exist: pass the prefix"):
            IndexedTokens(tmp_path / "d")
        os.rename(tmp_path / "moved", tmp_path / f"d{suffix}")
    size = (tmp_path / "d.bin").stat().st_size
    with open(tmp_path / "d.bin", "r+b") as f:
        f.truncate(size - 3)
    with pytest.raises(DataError, match=rf"d.bin is {size - 3} bytes but .* tokens end at byte {size}") as e:
        IndexedTokens(tmp_path / "d")
    assert "\n" not in str(e.value)
    (tmp_path / "e.idx").write_bytes(b"not an index at all, but long enough" * 2)
    (tmp_path / "e.bin").write_bytes(b"")
    with pytest.raises(DataError, match="no MMIDIDX header"):
        IndexedTokens(tmp_path / "e")
    head = (tmp_path / "d.idx").read_bytes()
    (tmp_path / "f.idx").write_bytes(head[:60])
    (tmp_path / "f.bin").write_bytes(b"")
    with pytest.raises(DataError, match="shorter than the .* its header promises"):
        IndexedTokens(tmp_path / "f")


def test_split_parsing_and_document_ranges():
    assert parse_split("949,50,1") == pytest.approx((0.949, 0.05, 0.001))
    assert parse_split("98/2") == pytest.approx((0.98, 0.02, 0.0))
    for bad in ("1,2,3,4", "a,b", "0,0,0", "-1,2", "nan,1"):
        with pytest.raises(DataError, match=f"--split {bad}"):
            parse_split(bad)
    assert split_documents(parse_split("949,50,1"), 1000) == [(0, 949), (949, 999), (999, 1000)]
    assert split_documents(parse_split("1,1,1"), 10) == [(0, 3), (3, 7), (7, 10)]


def test_blend_parsing():
    assert parse_blend(["0.7", "a", "0.3", "b"]) == [(0.7, "a"), (0.3, "b")]
    assert parse_blend(["a", "b"]) == [(None, "a"), (None, "b")]
    for words, msg in ((["0.7", "a", "x", "b"], "weight 'x' .* does not parse"), (["0.7", "a", "0.3"], "no prefix"),
                       (["a", "0.3", "b"], "looks like a weight"), (["0", "a"], "weight '0'"), ([], "empty"),
                       (["0.5", "0.5"], "should be a prefix")):
        with pytest.raises(DataError, match=msg):
            parse_blend(words)
    with pytest.raises(DataError, match="never be sampled"):
        quotas([1.0, 1e-9])


class _Ids:
    def __init__(self, k: int) -> None:
        self.k = k

    def sample(self, i: int) -> np.ndarray:
        return np.array([self.k, i])


def test_blend_realises_its_weights_and_locates_any_sample():
    blend = Blend([0.7, 0.2, 0.1], [_Ids(0), _Ids(1), _Ids(2)])
    assert sum(blend.quota) == ROUND
    n = ROUND + 12345
    seen = [blend.sample(i) for i in range(0, n)]
    counts = np.bincount([int(s[0]) for s in seen], minlength=3)
    assert counts.tolist() == blend.needed(n)
    for k in range(3):                                           # each dataset's samples in order 0, 1, 2, ...
        assert [int(s[1]) for s in seen if s[0] == k] == list(range(counts[k]))
    assert np.allclose(np.bincount([int(s[0]) for s in seen[:ROUND]]) / ROUND, [0.7, 0.2, 0.1], atol=1 / ROUND)
    window = np.bincount([int(s[0]) for s in seen[:1000]], minlength=3)      # interleaved evenly, not in runs
    assert np.allclose(window / 1000, [0.7, 0.2, 0.1], atol=0.01)


def test_samples_are_windows_of_each_epochs_shuffled_stream(tmp_path):
    docs = random_dataset(tmp_path / "d", docs=50, sequences_per_doc=2)
    data = IndexedTokens(tmp_path / "d")
    s = GPTSamples(data, (5, 45), seq=16, seed=3, cache=tmp_path / "c")
    assert s.build(2) == [0, 1] and s.build(2) == []                  # built once, then reused
    s.open(2)
    for epoch in range(2):
        order, _, shuffle = s._epochs[epoch]
        stream = np.concatenate([data.tokens(int(q)) for q in order])
        assert sorted(int(q) for q in order) == list(range(10, 90))     # documents 5..44, two sequences each
        assert stream.size == s.tokens_per_epoch == sum(d.size for d in docs[5:45])
        got = np.stack([s.sample(epoch * s.per_epoch + j) for j in range(s.per_epoch)])
        want = np.stack([stream[p * 16: p * 16 + 17] for p in shuffle])
        assert np.array_equal(got, want)
    other = GPTSamples(data, (5, 45), seq=16, seed=3, cache=tmp_path / "c2")
    other.build(1)
    other.open(1)
    assert all(np.array_equal(other.sample(i), s.sample(i)) for i in range(s.per_epoch))
    reseeded = GPTSamples(data, (5, 45), seq=16, seed=4, cache=tmp_path / "c")
    assert reseeded.folder != s.folder
    with pytest.raises(DataError, match="is missing"):
        reseeded.open(1)


def test_a_context_parallel_rank_reads_its_chunks_and_their_targets_only(tmp_path):
    """Under context parallelism a sample is read in the spans of one rank's two chunks (the chunk and the token
    after it): those positions equal the whole sample's, the others stay 0, and the ranks of a group together
    read every position of it; the spans cross document boundaries as the whole read does."""
    from axgrid.context_parallel import sample_spans
    random_dataset(tmp_path / "d", docs=30, max_len=9, seed=2)                # short documents: windows cross them
    data = IndexedTokens(tmp_path / "d")
    s = GPTSamples(data, (0, 30), seq=16, seed=1, cache=tmp_path / "c")
    s.build(1)
    s.open(1)
    for cp in (1, 2, 4):
        for i in range(min(s.per_epoch, 6)):
            whole = s.sample(i)
            union = np.zeros(17, dtype=bool)
            for index in range(cp):
                spans = sample_spans(16, cp, index)
                part = s.sample(i, spans)
                inside = np.zeros(17, dtype=bool)
                for a, b in spans:
                    inside[a:b] = True
                assert np.array_equal(part[inside], whole[inside]) and not part[~inside].any(), (cp, index)
                union |= inside
            assert union.all()
    assert sample_spans(16, 2, 0) == [(0, 5), (12, 17)] and sample_spans(16, 2, 1) == [(4, 9), (8, 13)]


def test_corpus_without_a_grid_and_split_tokens(tmp_path):
    docs = random_dataset(tmp_path / "d", docs=100, vocab=300)
    settings = DataSettings((str(tmp_path / "d"),), "80,20,0", cache=str(tmp_path / "c"))
    corpus = Corpus(settings, None, seq=8, seed=0, vocab=300, train_samples=500, valid_samples=16)
    x, y = corpus.batch(2, 4, rows=[1, 3])
    assert x.shape == (4, 8) and not x[0].any() and not x[2].any() and x[1].any()
    assert np.array_equal(x[1, 1:], y[1, :-1])
    whole, _ = corpus.batch(2, 4)
    assert np.array_equal(whole[[1, 3]], x[[1, 3]])
    corpus.seek(2, 10, 4)                      # resumed at step 2 after 10 samples (the batch size changed)
    fresh = Corpus(settings, None, seq=8, seed=0, vocab=300, train_samples=500)
    assert np.array_equal(corpus.batch(2, 4)[0], fresh.batch(0, 16)[0][10:14])
    assert corpus.position(3, 4) == {"consumed_samples": 14}
    valid = split_tokens(settings, "valid", 10**9)
    assert np.array_equal(valid, np.concatenate(docs[80:]))
    with pytest.raises(SystemExit, match="token id 299 >= the model's vocabulary 200"):
        Corpus(settings, None, seq=8, seed=0, vocab=200, train_samples=10)
    with pytest.raises(SystemExit, match="the valid split .* fewer than one sample"):
        Corpus(DataSettings(settings.paths, "100,0,0", settings.cache), None, 8, 0, 300, 10, valid_samples=4)


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssFile from Linux's /proc")
def test_reading_a_whole_epoch_leaves_no_pages_in_rss(tmp_path):
    rng = np.random.default_rng(0)
    with IndexedWriter(tmp_path / "big", np.uint8) as w:
        for _ in range(400):
            w.add(rng.integers(0, 256, 40_000))                      # 16 MB of tokens
    corpus = Corpus(DataSettings((str(tmp_path / "big"),), "100,0,0", str(tmp_path / "c")), None, seq=1024, seed=0,
                    vocab=256, train_samples=1)
    per_epoch = corpus.train.parts[0].per_epoch
    before = _rss_file_kib()
    for step in range(per_epoch // 8):
        corpus.batch(step, 8)
    assert _rss_file_kib() - before < 4096                       # without release() the 16 MB stay mapped in
