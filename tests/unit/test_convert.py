"""axgrid.convert: a GGUF file that transformers cannot read (an architecture it has no GGUF mapping for, a
quantisation gguf cannot dequantise, a file that is not GGUF) is refused with one line naming the file and the
value, and nothing is written; a folder holding other files is never overwritten; and a second conversion of the
same file is found in the cache at once (SmolLM2, converted once per session). Marked realmodel: in CI a missing
gguf/accelerate fails instead of skipping."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers import ROOT, SMOLLM2_GGUF
from helpers.tiny_gguf import write_gguf

from axgrid.convert import ConvertError, convert_gguf
from axgrid.convert.gguf import STAMP

pytestmark = pytest.mark.realmodel


def _nothing_written(root, out) -> None:
    assert not os.path.exists(out)
    assert sorted(os.listdir(root)) == ["in.gguf"], os.listdir(root)       # no partial folder left beside it


@pytest.mark.parametrize("case, expected", [
    ({"arch": "rwkv6"}, ["architecture 'rwkv6'", "llama"]),
    ({"quant": "Q8_1"}, ["quantised as Q8_1", "requantise"]),
])
def test_an_unreadable_gguf_is_refused_in_one_line(gguf_tools, tmp_path, case, expected):
    src = write_gguf(str(tmp_path / "in.gguf"), **case)
    out = tmp_path / "out"
    with pytest.raises(ConvertError) as e:
        convert_gguf(src, out)
    message = str(e.value)
    assert "\n" not in message and message.startswith(src), message
    assert all(x in message for x in expected), message
    _nothing_written(tmp_path, out)


def test_a_file_that_is_not_gguf_and_a_missing_one(gguf_tools, tmp_path):
    src = tmp_path / "in.gguf"
    src.write_text("not a model")
    with pytest.raises(ConvertError, match="is not a GGUF file"):
        convert_gguf(src, tmp_path / "out")
    _nothing_written(tmp_path, tmp_path / "out")
    with pytest.raises(ConvertError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    with pytest.raises(ConvertError, match="no installed package 'no_such_package_here'"):
        convert_gguf("no_such_package_here:x.gguf", tmp_path / "out")


def test_a_folder_with_other_files_is_not_overwritten(gguf_tools, tmp_path):
    src = write_gguf(str(tmp_path / "in.gguf"))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConvertError, match=f"no {STAMP}"):
        convert_gguf(src, out)
    assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_the_command_line_prints_one_line_and_exits_2(gguf_tools, tmp_path):
    src = write_gguf(str(tmp_path / "in.gguf"), arch="rwkv6")
    r = subprocess.run([sys.executable, "-m", "axgrid.convert", "gguf", src, str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "architecture 'rwkv6'" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_second_conversion_is_found_in_the_cache(smollm2):
    before = {f: os.stat(os.path.join(smollm2, f)).st_mtime_ns for f in os.listdir(smollm2)}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", STAMP} <= set(before)
    t0 = time.perf_counter()
    result = convert_gguf(SMOLLM2_GGUF, smollm2)
    assert result.cached and time.perf_counter() - t0 < 5
    assert before == {f: os.stat(os.path.join(smollm2, f)).st_mtime_ns for f in os.listdir(smollm2)}
