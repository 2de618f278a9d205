"""The runtime, the tuner and the performance model read one table of named GPT sizes (``axgrid.spec``)."""
from axgrid import perfmodel
from axgrid.kernels import shapes
from axgrid.models import GPTConfig
from axgrid.spec import NAMED_SIZES


def test_named_sizes_agree():
    for name, shape in NAMED_SIZES.items():
        assert shape.name == name and GPTConfig.named(name).shape == shape == perfmodel.get_model(name), name
        assert shapes.model_sizes(name) == (shape.layers, shape.hidden, shape.heads), name
    assert set(NAMED_SIZES) == set(GPTConfig.names())
