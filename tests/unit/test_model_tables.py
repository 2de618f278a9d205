"""The runtime, the tuner and the performance model read one table of named GPT sizes (``axgrid.spec``)."""
from axgrid import perfmodel
from axgrid.kernels import shapes
from axgrid.models import GPTConfig
from axgrid.spec import NAMED_SIZES


def test_named_sizes_agree():
    for name, (layers, hidden, heads, seq, vocab) in NAMED_SIZES.items():
        cfg = GPTConfig.named(name)
        assert (cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.vocab) == (layers, hidden, heads, seq, vocab), name
        assert shapes.model_sizes(name) == (layers, hidden, heads), name
        spec = perfmodel.get_model(name)
        assert (spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab) == (layers, hidden, heads, seq, vocab), name
    assert set(perfmodel.MODELS) == set(NAMED_SIZES) == set(GPTConfig.names())
