"""python -m axgrid.data preprocess: JSONL, .jsonl.gz, .jsonl.zst and plain text in one run (worker processes)
give the documents' UTF-8 bytes or the fast tokenizer's ids, with document boundaries and end-of-document ids; a
corrupt or truncated line is reported with its file and line and either stops the run with no output or is
skipped; the progress bar shows documents and tokens per second."""
import gzip
import io
import os

import numpy as np
import pytest

from axgrid.data.__main__ import main as data_main
from axgrid.data.indexed import IndexedTokens
from axgrid.data.preprocess import PreprocessError, PreprocessSettings, Progress, preprocess
from helpers.corpus import kjv_chapters, write_jsonl

DOCS = kjv_chapters()[:12]


def _quiet() -> Progress:
    return Progress(io.StringIO(), bar=False, every_s=0)


def _docs(prefix) -> list[np.ndarray]:
    data = IndexedTokens(prefix)
    return [np.concatenate([data.tokens(s) for s in data.doc_sequences(d, d + 1)] or [np.zeros(0, data.dtype)])
            for d in range(data.documents)]


def test_every_input_kind_in_one_run_with_two_workers(tmp_path):
    import zstandard
    write_jsonl(tmp_path / "a.jsonl", DOCS[:4])
    write_jsonl(tmp_path / "b.jsonl", DOCS[4:8], key="body")
    with open(tmp_path / "b.jsonl", "rb") as f:
        raw = f.read()
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "d.txt").write_text("".join(DOCS[8:]) * 3, encoding="utf-8")      # > one 64 KiB chunk
    for name in ("b.jsonl.gz", "c.jsonl.zst"):
        s = PreprocessSettings([str(tmp_path / name)], str(tmp_path / name), json_key="body")
        preprocess(s, _quiet())
        assert [d.tobytes().decode() for d in _docs(tmp_path / name)] == DOCS[4:8]
    s = PreprocessSettings([str(tmp_path / "a.jsonl"), str(tmp_path / "d.txt")], str(tmp_path / "out"),
                           workers=2, batch_docs=3)
    report = preprocess(s, _quiet())
    docs = _docs(tmp_path / "out")
    assert [d.tobytes().decode() for d in docs] == DOCS[:4] + ["".join(DOCS[8:]) * 3]
    assert report.documents == 5 and report.tokens == sum(d.size for d in docs) and report.skipped == 0
    assert IndexedTokens(tmp_path / "out").dtype == np.uint8
    assert "documents" in report.line() and "tokens/s per worker" in report.line()


def test_fast_tokenizer_with_end_of_document(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    from helpers.tiny_hf import byte_bpe
    folder = byte_bpe(str(tmp_path / "hf"), vocab=320)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"eos_token": "<eod>"})
    tok.save_pretrained(folder)
    eod = tok.eos_token_id
    write_jsonl(tmp_path / "a.jsonl", DOCS[:6])
    rc = data_main(["preprocess", "--input", str(tmp_path / "a.jsonl"), "--tokenizer", folder, "--out",
                    str(tmp_path / "t"), "--append-eod", "--no-progress"])
    assert rc == 0
    assert IndexedTokens(tmp_path / "t").dtype == np.uint16
    want = [tok(d, add_special_tokens=False)["input_ids"] + [eod] for d in DOCS[:6]]
    assert [d.tolist() for d in _docs(tmp_path / "t")] == want


def test_corrupt_lines_fail_or_are_skipped_with_file_and_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    with open(path, "a") as f:
        f.write('{"text": "fine"}\n{"text": 3}\n["a list"]\n{"other": "x"}\n{"text": "cut in the mid\n{"text": "end"}\n')
    out = str(tmp_path / "o")
    with pytest.raises(PreprocessError, match=r"a\.jsonl:5: 'text' holds a int.*--on-error skip"):
        preprocess(PreprocessSettings([path], out), _quiet())
    assert not [p for p in os.listdir(tmp_path) if p.startswith("o")]             # nothing written
    assert data_main(["preprocess", "--input", path, "--out", out, "--no-progress"]) == 2
    assert "a.jsonl:5:" in capsys.readouterr().err
    report = preprocess(PreprocessSettings([path], out, on_error="skip"), _quiet(), stderr=io.StringIO())
    assert report.skipped == 4 and report.documents == 5
    assert [e.split(": ", 1)[0].rsplit("/", 1)[1] for e in report.errors] == \
        ["a.jsonl:5", "a.jsonl:6", "a.jsonl:7", "a.jsonl:8"]
    assert "not a JSON line" in report.errors[3] and "no key 'text'" in report.errors[2]
    assert [d.tobytes().decode() for d in _docs(out)] == DOCS[:3] + ["fine", "end"]
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read())[:-40])                    # a truncated stream
    report = preprocess(PreprocessSettings([str(gz)], str(tmp_path / "g"), on_error="skip"), _quiet(),
                        stderr=io.StringIO())
    assert any("t.jsonl.gz:" in e and "ends early" in e for e in report.errors)
    bad_text = tmp_path / "bad.txt"
    bad_text.write_bytes(b"good line\nbad \xff line\nlast\n")
    with pytest.raises(PreprocessError, match=r"bad\.txt:2: not UTF-8 text \(byte 0xff at column 5\)"):
        preprocess(PreprocessSettings([str(bad_text)], str(tmp_path / "b")), _quiet())


def test_progress_bar_shows_documents_and_tokens_per_second():
    stream = io.StringIO()
    p = Progress(stream, bar=True)
    p.update(10, 5000)
    p.close()
    text = stream.getvalue()
    assert "10 docs" in text and "tokens/s" in text
    lines = io.StringIO()
    p = Progress(lines, bar=False, every_s=1e-9)
    p.update(3, 300)
    assert "3 documents" in lines.getvalue() and "tokens (" in lines.getvalue()
