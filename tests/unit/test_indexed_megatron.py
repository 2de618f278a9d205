"""Interop with megatron-core itself (its indexed_dataset module, plain Python and numpy): megatron's
IndexedDataset reads what axgrid writes (IndexedWriter and python -m axgrid.data preprocess), and axgrid reads
what megatron's IndexedDatasetBuilder writes, documents of several sequences included (the two writers' files are
byte-identical), and trains from it."""
import io
import warnings

import numpy as np
import pytest

from axgrid.data.corpus import Corpus, DataSettings
from axgrid.data.indexed import IndexedTokens
from axgrid.data.preprocess import PreprocessSettings, Progress, preprocess
from helpers.corpus import kjv_chapters, random_dataset, write_jsonl

pytestmark = pytest.mark.slow                                   # importing megatron.core takes seconds


@pytest.fixture(scope="module")
def megatron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def test_megatron_reads_what_axgrid_writes(megatron, tmp_path):
    docs = random_dataset(tmp_path / "r", docs=60, vocab=70000, sequences_per_doc=2)
    ours = IndexedTokens(tmp_path / "r")
    theirs = megatron.IndexedDataset(str(tmp_path / "r"))
    assert theirs.index.dtype == np.int32 and len(theirs) == 120
    assert np.array_equal(theirs.sequence_lengths, ours.lengths)
    assert np.array_equal(theirs.index.sequence_pointers, ours.pointers)
    assert np.array_equal(theirs.document_indices, ours.doc_index)
    for d, want in enumerate(docs):
        a, b = theirs.document_indices[d], theirs.document_indices[d + 1]
        assert np.array_equal(np.concatenate([theirs[i] for i in range(a, b)]), want)
    chapters = kjv_chapters()[:20]
    path = write_jsonl(tmp_path / "k.jsonl", chapters)
    preprocess(PreprocessSettings([path], str(tmp_path / "k")), Progress(io.StringIO(), bar=False, every_s=0))
    k = megatron.IndexedDataset(str(tmp_path / "k"))
    assert k.index.dtype == np.uint8 and len(k.document_indices) == 21
    assert [bytes(k[i]).decode() for i in range(20)] == chapters
    assert bytes(k.get(3, offset=5, length=7)).decode() == chapters[3][5:12]


def test_axgrid_reads_what_megatron_writes(megatron, tmp_path):
    import torch
    from axgrid.data.indexed import IndexedWriter
    rng = np.random.default_rng(1)
    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    docs = []
    with IndexedWriter(tmp_path / "a", np.uint16) as ours_writer:
        for _ in range(80):
            parts = [rng.integers(0, 1000, int(rng.integers(1, 40))) for _ in range(int(rng.integers(1, 4)))]
            for p in parts:
                builder.add_item(torch.from_numpy(p))
                ours_writer.add(p)
            builder.end_document()
            ours_writer.end_document()
            docs.append(np.concatenate(parts))
    builder.finalize(str(tmp_path / "m.idx"))
    for ext in (".idx", ".bin"):                                 # the two writers agree byte for byte
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()
    ours = IndexedTokens(tmp_path / "m")
    assert ours.dtype == np.uint16 and ours.documents == 80
    for d, want in enumerate(docs):
        assert np.array_equal(np.concatenate([ours.tokens(s) for s in ours.doc_sequences(d, d + 1)]), want)
    corpus = Corpus(DataSettings((str(tmp_path / "m"),), "90,10,0", str(tmp_path / "c")), None, seq=16, seed=0,
                    vocab=1000, train_samples=64, valid_samples=8)
    x, y = corpus.batch(0, 8)
    order, _, shuffle = corpus.train.parts[0]._epochs[0]         # epoch 0: the documents' order, the samples'
    assert sorted(order.tolist()) == list(range(ours.doc_index[72]))            # the train split: 72 documents
    stream = np.concatenate([docs_seq for q in order for docs_seq in [ours.tokens(int(q))]])
    for row, p in zip(torch.cat([x, y[:, -1:]], 1).numpy(), shuffle[:8]):
        assert np.array_equal(row, stream[p * 16: p * 16 + 17])
