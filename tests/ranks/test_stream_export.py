"""Streaming export: iter_dense_state_dict yields every tensor once, dense, on the writing rank
only, holding one assembled tensor at a time, with the parts moved point to point (the ledger proves the other
ranks receive nothing); export_pretrained writes save_pretrained's file layout for max_shard_size, the files are
safetensors, and both Hugging Face's from_pretrained and axgrid.from_pretrained of the export give the parallel
model's logits."""
from __future__ import annotations

import json
import os
import weakref

import pytest
import torch

import axgrid
from axgrid.metrics.memtrack import LiveBytes
from axgrid.io.safetensors_writer import SafetensorsWriter

#: grid, writing rank, max_shard_size, export's chunk_bytes (256 and 300: slabs of 2 rows of 32 fp32; 16 MiB: whole)
GRIDS = [("2x2x1x1", 0, 20_000, 256), ("1x2x2x1", 2, "50GB", None), ("1x1x2x2", 3, 9_000, 300)]


def _config():
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, tie_word_embeddings=False,
                       bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _dense_files(where: str) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors import safe_open
    out = {}
    for fname in sorted(f for f in os.listdir(where) if f.endswith(".safetensors")):
        with safe_open(os.path.join(where, fname), "pt") as f:
            assert f.metadata() == {"format": "pt"}
            out[fname] = {k: f.get_tensor(k) for k in f.keys()}
    return out


def rank_stream(tmp: str) -> dict:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    from axgrid.plans import gather_logits
    logging.set_verbosity_error()
    out = {}
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(5))
    for spec, writer, shard, chunk in GRIDS:
        grid = axgrid.init(spec, timeout_s=60)
        try:
            torch.manual_seed(0)
            model = LlamaForCausalLM(_config())
            axgrid.parallelize(model, grid)
            with torch.no_grad():
                logits = gather_logits(model(input_ids=ids).logits, grid)
            want = axgrid.dense_state_dict(model, grid)
            own = {id(t) for t in model.state_dict(keep_vars=True).values()}
            tiled = [n for n, t in model.state_dict(keep_vars=True).items() if getattr(t, "axgrid_tile", None)]
            grid.ledger.reset()
            names, wrong, alive, made = [], [], 0, []
            for name, t in axgrid.iter_dense_state_dict(model, grid, rank=writer, chunk_bytes=1000):   # parts in chunks
                names.append(name)
                if not torch.equal(t, want[name]):
                    wrong.append(name)
                if id(t) not in own:
                    made.append(weakref.ref(t))
                alive = max(alive, sum(r() is not None for r in made))    # assembled tensors alive right now
                del t
            led = grid.ledger.snapshot()
            part_bytes = sum(t.numel() * t.element_size() for n, t in model.state_dict().items() if n in tiled)
            o = {"names": names, "wrong": wrong, "alive": alive, "made": len(made), "tiled": len(tiled),
                 "sent": led[("xyz", "send")].bytes if ("xyz", "send") in led else 0,
                 "recv": led[("xyz", "recv")].bytes if ("xyz", "recv") in led else 0, "part_bytes": part_bytes,
                 "dense_tiled_bytes": sum(want[n].numel() * want[n].element_size() for n in tiled),
                 "keys": list(model.state_dict())}
            where = os.path.join(tmp, spec)
            live = LiveBytes(existing=model.state_dict(keep_vars=True).values())   # the parts: there already
            before = live.current
            with live:                          # every tensor the export makes, while it lives
                done = axgrid.export_pretrained(model, where, grid, rank=writer, max_shard_size=shard,
                                                **({"chunk_bytes": chunk} if chunk else {}))
            assert done == where
            o["export_peak"] = live.peak - before
            o["dense_max"] = max(t.numel() * t.element_size() for t in want.values())
            back = axgrid.from_pretrained(where, grid)            # axgrid's own reader, on this grid
            with torch.no_grad():
                o["axgrid_logits"] = float((gather_logits(back(input_ids=ids).logits, grid) - logits).abs().max())
            del back
            if grid.rank == writer:
                files = _dense_files(where)
                o["files"] = {f: {k: v.numel() * v.element_size() for k, v in ts.items()} for f, ts in files.items()}
                o["file_wrong"] = [k for ts in files.values() for k, v in ts.items() if not torch.equal(v, want[k])]
                index = os.path.join(where, "model.safetensors.index.json")
                o["index"] = json.load(open(index)) if os.path.exists(index) else None
                o["listing"] = sorted(os.listdir(where))
                loaded = LlamaForCausalLM.from_pretrained(where)
                with torch.no_grad():
                    o["hf_logits"] = float((loaded(input_ids=ids).logits - logits).abs().max())
            if spec == GRIDS[0][0]:                 # a file where the directory should be: refused on every rank
                blocker = os.path.join(tmp, "not-a-dir")
                if grid.rank == writer:
                    open(blocker, "w").close()
                try:
                    axgrid.export_pretrained(model, blocker, grid, rank=writer)
                    o["blocked"] = "wrote"
                except (OSError, RuntimeError) as e:
                    o["blocked"] = str(e)
                for call in (lambda: axgrid.export_pretrained(model, blocker, grid, chunk_bytes=0),   # before any
                             lambda: axgrid.iter_dense_state_dict(model, grid, chunk_bytes=0)):        # collective
                    with pytest.raises(ValueError, match=r"chunk_bytes=0 must be a positive number of bytes"):
                        call()
            out[spec] = o
        finally:
            grid.destroy()
    return out


def _save_pretrained_layout(where: str, shard) -> tuple[list[str], dict | None]:
    """What transformers' save_pretrained writes for the same model (here, outside the ranks: it saves on the
    main process only)."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(_config()).save_pretrained(where, max_shard_size=shard)
    index = os.path.join(where, "model.safetensors.index.json")
    return sorted(os.listdir(where)), (json.load(open(index)) if os.path.exists(index) else None)


@pytest.mark.slow
def test_stream_iterator_ledger_and_hf_round_trip(ranks, tmp_path):
    outs = ranks(4, rank_stream, str(tmp_path))
    for spec, writer, shard, chunk in GRIDS:
        hf_listing, hf_index = _save_pretrained_layout(str(tmp_path / f"{spec}-hf"), shard)
        group = [r for r in range(4) if outs[r][spec]["sent"] or outs[r][spec]["recv"] or r == writer]
        w = outs[writer][spec]
        assert w["names"] == w["keys"] and w["wrong"] == [], spec                 # every tensor once, dense
        assert w["made"] == w["tiled"] and w["alive"] == 1, spec                   # one assembled at a time
        # the writer receives exactly what it lacks; the others receive nothing and send at most their parts
        assert w["recv"] + w["part_bytes"] == w["dense_tiled_bytes"], spec
        assert sum(outs[r][spec]["sent"] for r in range(4)) == w["recv"], spec
        for r in range(4):
            if r != writer:
                o = outs[r][spec]
                assert o["names"] == [] and o["recv"] == 0 and o["sent"] <= o["part_bytes"], (spec, r)
        assert len(group) > 1
        # the export assembles slabs, never a whole tensor: with 256-300 byte slabs the writer's live tensors
        # peak below the largest dense tensor (8 KiB; what is left is the pieces' geometry, gathered once)
        if chunk:
            assert w["export_peak"] < w["dense_max"], (spec, w["export_peak"], w["dense_max"])
        # the files: save_pretrained's layout for this max_shard_size, each within it, safetensors, dense values
        assert w["file_wrong"] == [] and w["index"] == hf_index, spec
        assert [f for f in w["listing"] if f.endswith(".safetensors")] == \
            [f for f in hf_listing if f.endswith(".safetensors")], spec
        assert {"config.json", "generation_config.json"} <= set(w["listing"]), spec
        assert not any(f.endswith(".tmp") for f in w["listing"]), spec
        limit = shard if isinstance(shard, int) else 50 * 10**9
        for f, sizes in w["files"].items():
            assert sum(sizes.values()) <= limit or len(sizes) == 1, (spec, f)
        if isinstance(shard, int):
            assert len(w["files"]) > 1 and w["index"]["metadata"]["total_size"] == sum(
                sum(s.values()) for s in w["files"].values()), spec
        else:
            assert list(w["files"]) == ["model.safetensors"] and w["index"] is None, spec
        assert w["hf_logits"] < 1e-5, spec
        assert all(outs[r][spec]["axgrid_logits"] < 1e-5 for r in range(4)), spec
    for r in range(4):
        msg = outs[r][GRIDS[0][0]]["blocked"]
        assert ("is a file; pass a directory" in msg) if r == GRIDS[0][1] else ("could not write" in msg), (r, msg)


def test_safetensors_writer_checks_order_and_leaves_no_half_file(tmp_path):
    from safetensors import safe_open
    path = str(tmp_path / "x.safetensors")
    a, b = torch.arange(6.0).view(2, 3), torch.ones(4, dtype=torch.bfloat16)
    layout = [("a", a.dtype, a.shape), ("b", b.dtype, b.shape)]
    for wrong, msg in ((["b"], r"expected a torch.float32 \[2, 3\] next, got b"), (["a"], r"1 tensor\(s\) never written")):
        with pytest.raises(ValueError, match=msg):
            with SafetensorsWriter(path, layout) as w:
                for name in wrong:
                    w.write(name, {"a": a, "b": b}[name])
        assert os.listdir(tmp_path) == []                      # no half-written file, not even the temporary
    with SafetensorsWriter(path, [("a", a.dtype, a.shape), ("b", b.dtype, b.shape)]) as w:
        w.write("a", a)
        w.write("b", b)
    with safe_open(path, "pt") as f:
        assert torch.equal(f.get_tensor("a"), a) and torch.equal(f.get_tensor("b"), b)
        assert torch.equal(f.get_slice("a")[1:, 1:], a[1:, 1:])


def test_safetensors_writer_takes_a_tensor_in_slabs_of_rows(tmp_path):
    from safetensors import safe_open
    path = str(tmp_path / "rows.safetensors")
    a, s = torch.arange(12.0).view(4, 3), torch.tensor(7, dtype=torch.int64)
    layout = [("a", a.dtype, a.shape), ("s", s.dtype, s.shape)]
    with pytest.raises(ValueError, match=r"from row 0 next, got a torch.float32 \[1, 3\] from row 1"):
        with SafetensorsWriter(path, layout) as w:
            w.write_rows("a", 1, a[1:2])                          # rows must come in order, from row 0
    with pytest.raises(ValueError, match=r"expected a .* from row 3 next, got s"):
        with SafetensorsWriter(path, layout) as w:
            w.write_rows("a", 0, a[:3])
            w.write("s", s)                                       # a is not complete yet
    assert os.listdir(tmp_path) == []
    with SafetensorsWriter(path, layout) as w:
        w.write_rows("a", 0, a[:1])
        w.write_rows("a", 1, a[1:4])
        w.write_rows("s", 0, s)
    with safe_open(path, "pt") as f:
        assert torch.equal(f.get_tensor("a"), a) and torch.equal(f.get_tensor("s"), s)
