"""The rank layout, grid specs and launch detection: pure functions, no processes."""
import pytest
from hypothesis import given, settings, strategies as st

from axgrid.launch.env import LaunchError, detect_launch, expand_hostlist
from axgrid.spec.layout import Coord, GridError, GridShape, RankLayout, all_shapes

shapes = st.tuples(*[st.integers(1, 4)] * 4).map(lambda t: GridShape(*t))
orders = st.permutations("xyzd").map("".join)


@given(shapes, orders)
@settings(max_examples=60, deadline=None)
def test_rank_coord_bijection(shape, order):
    lay = RankLayout(shape, order)
    seen = set()
    for r in range(shape.size):
        c = lay.coord(r)
        assert lay.rank(c) == r
        seen.add((c.x, c.y, c.z, c.d))
    assert len(seen) == shape.size


def test_default_order_formula():
    lay = RankLayout(GridShape(2, 3, 2, 2))
    for r in range(24):
        assert lay.coord(r) == Coord(r % 2, (r // 2) % 3, (r // 6) % 2, r // 12)


@given(shapes, orders, st.sampled_from(["x", "y", "z", "d", "xy", "xyz"]))
@settings(max_examples=60, deadline=None)
def test_groups_partition_and_vary_only_their_dims(shape, order, dims):
    lay = RankLayout(shape, order)
    groups = lay.groups(dims)
    flat = sorted(r for g in groups for r in g)
    assert flat == list(range(shape.size))
    for g in groups:
        assert len(g) == shape.extent(dims)
        for i, r in enumerate(g):
            assert lay.index_in(r, dims) == i
            for other in "xyzd":
                if other not in dims:
                    assert lay.coord(r)[other] == lay.coord(g[0])[other]


def test_x_groups_are_consecutive_ranks():
    assert RankLayout(GridShape(4, 2, 1, 1)).groups("x") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert RankLayout(GridShape(2, 2, 2, 1)).groups("z") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert RankLayout(GridShape(2, 2, 1, 1), order="yxzd").groups("y") == [[0, 1], [2, 3]]


def test_parse_specs():
    assert GridShape.parse("2x2x2x1") == GridShape(2, 2, 2, 1)
    assert GridShape.parse("2x1x3", world_size=12) == GridShape(2, 1, 3, 2)
    assert GridShape.parse((1, 3, 1, 2), world_size=6) == GridShape(1, 3, 1, 2)


@pytest.mark.parametrize("spec,world,msg", [
    ("2x2x2x1", 6, "has 8 ranks but the world size is 6"),
    ("0x1x1x1", None, "gx=0 is invalid"),
    ("2x2", None, "must name 3 or 4 sizes"),
    ("2xax1x1", None, "not of the form"),
    ("3x1x1", 8, "does not divide the world size 8"),
])
def test_parse_errors(spec, world, msg):
    with pytest.raises(GridError, match=msg):
        GridShape.parse(spec, world)


def test_bad_order():
    with pytest.raises(GridError, match="permutation of the letters"):
        RankLayout(GridShape(1, 1, 1, 1), "xyzq")


def test_all_shapes_counts():
    # number of ordered factorisations of n into 4 factors
    assert [len(list(all_shapes(n))) for n in range(1, 9)] == [1, 4, 4, 10, 4, 16, 4, 20]


def test_hostlist():
    assert expand_hostlist("nid[001-003,007],login1") == ["nid001", "nid002", "nid003", "nid007", "login1"]
    assert expand_hostlist("node7") == ["node7"]
    assert expand_hostlist("gpu[09-11]") == ["gpu09", "gpu10", "gpu11"]


def test_detect_torchrun():
    e = detect_launch({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                       "MASTER_ADDR": "h0", "MASTER_PORT": "1234"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.master_port, e.launcher) == \
        (3, 8, 1, 4, "h0", 1234, "torchrun")


def test_detect_openmpi_and_mpich_without_mpi4py_rendezvous():
    e = detect_launch({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
                       "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                       "MASTER_ADDR": "a", "MASTER_PORT": "99"}, use_mpi=False)
    assert (e.rank, e.world_size, e.local_rank, e.launcher, e.master_addr, e.master_port) == (5, 6, 1, "openmpi",
                                                                                            "a", 99)
    e = detect_launch({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"},
                      use_mpi=False)
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.launcher) == (2, 4, 2, 4, "mpich")


def test_detect_slurm_master_is_first_node():
    # an srun task sets SLURM_STEP_NUM_TASKS (a batch script's own step does not: tests/unit/test_launch_table.py)
    e = detect_launch({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16", "SLURM_LOCALID": "1",
                       "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x4)", "SLURM_JOB_NODELIST": "nid[0040-0043]",
                       "SLURM_JOB_ID": "123456"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.launcher) == \
        (9, 16, 1, 4, "nid0040", "slurm")
    assert 20000 <= e.master_port < 40000


def test_detect_single_and_errors():
    assert detect_launch({}).world_size == 1
    with pytest.raises(LaunchError, match="not an integer"):
        detect_launch({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(LaunchError, match="expected 0 <= rank < size"):
        detect_launch({"RANK": "4", "WORLD_SIZE": "2"})
