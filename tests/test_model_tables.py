"""The runtime, the tuner and the performance model know the same named GPT sizes (each package keeps its own
table because perfmodel and kernels must not import axgrid)."""
from axgrid import kernels
from axgrid import perfmodel
from axgrid.models.gpt import NAMED_SIZES


def test_named_sizes_agree():
    assert set(kernels.MODELS) == set(NAMED_SIZES)
    for name, (layers, hidden, heads, seq, vocab) in NAMED_SIZES.items():
        assert kernels.MODELS[name] == (layers, hidden, heads), name
        spec = perfmodel.get_model(name)
        assert (spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab) == (layers, hidden, heads, seq, vocab), name
