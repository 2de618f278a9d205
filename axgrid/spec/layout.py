"""Where every rank sits on the virtual Gx x Gy x Gz x Gd grid. Pure arithmetic: no torch.distributed.

This is the one place that knows the rank layout. With the default order ``"xyzd"`` (x fastest)::

    x = r % Gx    y = (r // Gx) % Gy    z = (r // (Gx*Gy)) % Gz    d = r // (Gx*Gy*Gz)

so an x-group is Gx consecutive ranks (inside one node first). Any permutation of the letters
x, y, z, d is a valid order; the first letter varies fastest.

Context parallelism (``cp`` > 1) is no fifth letter: it splits the tokens that z and d already shard. The ranks of
one x·y position that differ in z and d are numbered ``t = z + Gz·d`` (z fastest); a context-parallel group ("c")
is ``cp`` consecutive such numbers, so it lies inside one z-group when ``cp`` divides Gz (the z-groups sit nearer in
rank numbers than the d-groups with the default order), or is made of whole z-groups when Gz divides ``cp``.
docs/design.md#context-parallelism says why.

Expert parallelism (``ep`` > 1) is no fifth letter either: it lives inside d. The expert-parallel group ("e") is the
``ep`` ranks of one x·y·z position whose d indices form one block of ``ep`` consecutive numbers (``d // ep`` equal);
a rank's place in it is ``d % ep`` (which experts it holds). The expert-replica group ("r") is the ``Gd / ep`` ranks of
one x·y·z position with the same ``d % ep``: the ranks holding the same experts, over which their gradients reduce.
docs/design.md#expert-parallelism says why.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

DIMS = "xyzd"


class GridError(ValueError):
    """A grid that cannot be built: bad shape, order, or a world size it does not divide."""


class WorldSizeMismatch(GridError):
    """A well-formed grid (four sizes, or a :class:`GridShape`) whose ranks are not the world size's. A caller that
    knows where that number came from (``-n``, ``--gpus``) catches it and says the fix in those terms, from
    ``shape`` and ``world_size``."""

    def __init__(self, shape: "GridShape", world_size: int) -> None:
        super().__init__(shape, world_size)         # the arguments as args: the error pickles across processes
        self.shape = shape
        self.world_size = world_size

    def __str__(self) -> str:
        return (f"grid {self.shape} has {self.shape.size} ranks but the world size is {self.world_size}; "
                f"choose Gx*Gy*Gz*Gdata = {self.world_size} (or leave Gdata out to infer it)")


def _name(spec: Union[str, Sequence[int]]) -> str:
    """A spec as the user wrote it."""
    return spec if isinstance(spec, str) else "x".join(map(str, spec))


def grid_sizes(spec: Union[str, Sequence[int]]) -> list[int]:
    """The 3 or 4 sizes a grid spec names (``"2x2x2"`` -> ``[2, 2, 2]``; a sequence as it is), not checked further
    (:class:`GridShape` checks each size); GridError, one line, when it does not have that form."""
    if not isinstance(spec, str):
        sizes = list(spec)
    else:
        try:
            sizes = [int(p) for p in spec.lower().replace("×", "x").split("x")]
        except ValueError:
            sizes = []
    if not sizes:
        raise GridError(f"grid {_name(spec)!r} is not of the form GXxGYxGZxGD, e.g. '2x2x2x1'")
    if len(sizes) not in (3, 4):
        raise GridError(f"grid {_name(spec)!r} must name 3 or 4 sizes (GXxGYxGZ[xGD]), got {len(sizes)}")
    return sizes


@dataclass(frozen=True)
class GridShape:
    """The four extents of the grid: Gx, Gy, Gz (tensor parallel) and Gd (data parallel)."""

    gx: int
    gy: int
    gz: int
    gd: int

    def __post_init__(self) -> None:
        for name, v in zip(("gx", "gy", "gz", "gdata"), self.as_tuple()):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GridError(f"grid size {name}={v!r} is invalid: every grid size must be an integer >= 1")

    @staticmethod
    def parse(spec: Union[str, Sequence[int], "GridShape"], world_size: int | None = None) -> "GridShape":
        """Read a grid from ``"2x2x2x1"``, ``"2x2x2"`` (Gd inferred), a tuple, or a GridShape: THE grammar of a grid
        (sizes joined by ``x`` or ``×``: Gx, Gy, Gz and Gd; with three, Gd is the ranks' number divided by
        Gx·Gy·Gz, where that number is known: a launched job, ``--gpus``), which every command (the launcher, the
        drivers, the dry run, perfmodel) reads with this function and no other, so a spec means the same, and fails
        with the same line, everywhere.

        The one rule for the world size: with three sizes Gd is ``world_size // (Gx*Gy*Gz)`` (``world_size``, the
        ranks, is then required); four sizes (or a GridShape) are taken as written and, where ``world_size`` is
        given, must have that many ranks (:class:`WorldSizeMismatch` otherwise). Every refusal is a one-line
        GridError that says the fix.
        """
        if isinstance(spec, GridShape):
            shape = spec
        else:
            sizes: list = grid_sizes(spec)
            if len(sizes) == 3:
                if world_size is None:
                    raise GridError(f"grid {_name(spec)!r} leaves Gdata out, so the world size is needed to infer it: "
                                    f"give four sizes GXxGYxGZxGD here, e.g. {_name(spec)}x1")
                tp = sizes[0] * sizes[1] * sizes[2]
                if tp < 1 or world_size % tp:
                    raise GridError(f"grid {_name(spec)!r}: Gx*Gy*Gz={tp} does not divide the world size "
                                    f"{world_size}; choose sizes whose product divides {world_size}")
                sizes.append(world_size // tp)
            shape = GridShape(*sizes)
        if world_size is not None and shape.size != world_size:
            raise WorldSizeMismatch(shape, world_size)
        return shape

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.gx, self.gy, self.gz, self.gd)

    def extent(self, dim: str) -> int:
        """Size of one dimension ``"x"``, ``"y"``, ``"z"`` or ``"d"`` (or product of several, e.g. ``"xyz"``)."""
        n = 1
        for c in dim:        # a plain loop: torch.compile traces it without a graph break
            n *= self.as_tuple()[DIMS.index(c)]
        return n

    @property
    def size(self) -> int:
        return math.prod(self.as_tuple())

    def __str__(self) -> str:
        return "x".join(str(v) for v in self.as_tuple())


@dataclass(frozen=True)
class Coord:
    x: int
    y: int
    z: int
    d: int

    def __getitem__(self, dim: str) -> int:
        return getattr(self, dim)


def check_order(order: str) -> str:
    if not isinstance(order, str) or sorted(order) != sorted(DIMS):
        raise GridError(f"order={order!r} must be a permutation of the letters 'xyzd' (fastest-varying first), "
                        f"e.g. 'xyzd' (default) or 'yxzd'")
    return order


@dataclass(frozen=True)
class RankLayout:
    """Rank <-> coordinates for one grid shape and rank order."""

    shape: GridShape
    order: str = "xyzd"
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        check_order(self.order)
        check_cp(self.shape, self.cp)
        check_ep(self.shape, self.ep)

    def _strides(self) -> dict[str, int]:
        strides, s = {}, 1
        for c in self.order:
            strides[c] = s
            s *= self.shape.extent(c)
        return strides

    def stride(self, dim: str) -> int:
        """Distance in rank numbers between neighbours along ``dim``."""
        return self._strides()[dim]

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.shape.size:
            raise GridError(f"rank {rank} is outside the grid {self.shape} (0..{self.shape.size - 1})")
        st = self._strides()
        return Coord(**{c: (rank // st[c]) % self.shape.extent(c) for c in DIMS})

    def rank(self, coord: Coord) -> int:
        st = self._strides()
        return sum(coord[c] * st[c] for c in DIMS)

    def groups(self, dims: str) -> list[list[int]]:
        """Every group of ranks that differ only in the letters of ``dims`` (e.g. ``"x"`` or ``"xyz"``).

        Groups are listed in a deterministic order (the same on every rank) and each group's ranks are
        ordered by their coordinate along ``dims`` (first letter fastest), so a member's index in its
        group is its position along that dimension.
        """
        other = [c for c in DIMS if c not in dims]
        inner = [c for c in dims]
        out = []
        for fixed in itertools.product(*(range(self.shape.extent(c)) for c in reversed(other))):
            fixed_map = dict(zip(reversed(other), fixed))
            members = []
            for var in itertools.product(*(range(self.shape.extent(c)) for c in reversed(inner))):
                m = dict(fixed_map, **dict(zip(reversed(inner), var)))
                members.append(self.rank(Coord(**m)))
            out.append(members)
        return out

    def describe(self, nodes: Sequence[int], dims_list: Sequence[str] = ("x", "y", "z", "d", "xy", "xyz"),
                 show: int = 16) -> list[str]:
        """One line per group kind: its ranks, stride, and how many of its groups stay inside one node.

        ``nodes[r]`` is the node index of rank r.
        """
        lines = []
        for dims in dims_list:
            size = self.shape.extent(dims)
            if size == 1:
                lines.append(f"  {dims:<4} size 1: no communication")
                continue
            groups = self.groups(dims)
            intra = sum(len({nodes[r] for r in g}) == 1 for g in groups)
            shown = " ".join("[" + ",".join(map(str, g)) + "]" for g in groups[:show])
            more = f" ... (+{len(groups) - show} more)" if len(groups) > show else ""
            lines.append(f"  {dims:<4} size {size}, stride {self.stride(dims[0])}: {shown}{more}  "
                         f"({intra}/{len(groups)} inside one node)")
        return lines

    def group_of(self, rank: int, dims: str) -> list[int]:
        """The group along ``dims`` that contains ``rank`` (as :meth:`groups` lists it; computed from the rank's
        coordinate alone, so a rank of a world of 32,768 finds its own without listing every group)."""
        fixed = {c: self.coord(rank)[c] for c in DIMS}
        inner = list(reversed(dims))
        return [self.rank(Coord(**dict(fixed, **dict(zip(inner, var)))))
                for var in itertools.product(*(range(self.shape.extent(c)) for c in inner))]

    def cp_groups(self) -> list[list[int]]:
        """Every context-parallel group ("c"), in a deterministic order, each member list in global rank order (as
        a process group orders its members: a member's index there is its place in the sequence's chunks)."""
        return [self.cp_group_of(self.rank(Coord(x, y, z, d)))
                for d in range(self.shape.gd) for z in range(self.shape.gz)
                for y in range(self.shape.gy) for x in range(self.shape.gx)
                if (z + self.shape.gz * d) % self.cp == 0]

    def cp_group_of(self, rank: int) -> list[int]:
        """The context-parallel group holding ``rank``: the ``cp`` ranks of its x·y position whose ``z + Gz·d`` are
        consecutive, the first a multiple of ``cp``; in global rank order (which is that order unless the grid's
        order puts d before z)."""
        c, gz = self.coord(rank), self.shape.gz
        first = (c.z + gz * c.d) // self.cp * self.cp
        return sorted(self.rank(Coord(c.x, c.y, t % gz, t // gz)) for t in range(first, first + self.cp))

    def cp_index(self, rank: int) -> int:
        """Position of ``rank`` in its context-parallel group, the process group's order (which chunks of each
        sequence it holds)."""
        return self.cp_group_of(rank).index(rank)

    def ep_group_of(self, rank: int) -> list[int]:
        """The expert-parallel group ("e") holding ``rank``: the ``ep`` ranks of its x·y·z position whose d lie in
        its block ``[d // ep · ep, d // ep · ep + ep)``, in d order (a member's index there is ``d % ep``)."""
        c = self.coord(rank)
        first = c.d // self.ep * self.ep
        return [self.rank(Coord(c.x, c.y, c.z, d)) for d in range(first, first + self.ep)]

    def ep_groups(self) -> list[list[int]]:
        """Every expert-parallel group, in a deterministic order (the same on every rank)."""
        return [self.ep_group_of(self.rank(Coord(x, y, z, d)))
                for d in range(0, self.shape.gd, self.ep) for z in range(self.shape.gz)
                for y in range(self.shape.gy) for x in range(self.shape.gx)]

    def replica_group_of(self, rank: int) -> list[int]:
        """The expert-replica group ("r") holding ``rank``: the ``Gd / ep`` ranks of its x·y·z position with its
        ``d % ep`` (the same experts), in d order."""
        c = self.coord(rank)
        return [self.rank(Coord(c.x, c.y, c.z, d)) for d in range(c.d % self.ep, self.shape.gd, self.ep)]

    def replica_groups(self) -> list[list[int]]:
        """Every expert-replica group, in a deterministic order (the same on every rank)."""
        return [self.replica_group_of(self.rank(Coord(x, y, z, d)))
                for d in range(self.ep) for z in range(self.shape.gz)
                for y in range(self.shape.gy) for x in range(self.shape.gx)]

    def index_in(self, rank: int, dims: str) -> int:
        """Position of ``rank`` inside its group along ``dims`` (first letter fastest)."""
        c = self.coord(rank)
        idx, mul = 0, 1
        for letter in dims:
            idx += c[letter] * mul
            mul *= self.shape.extent(letter)
        return idx


def cp_sizes(shape: GridShape) -> list[int]:
    """The context-parallel sizes ``shape`` takes: those dividing Gz·Gd that divide Gz or that Gz divides (a group
    inside one z-group, or of whole z-groups; see the module docstring)."""
    zd = shape.gz * shape.gd
    return [c for c in range(1, zd + 1) if zd % c == 0 and (shape.gz % c == 0 or c % shape.gz == 0)]


def check_cp(shape: GridShape, cp: int) -> int:
    """``cp`` when ``shape`` takes it; a one-line GridError naming the sizes that work otherwise."""
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise GridError(f"context-parallel size cp={cp!r} is invalid: it must be an integer >= 1 (1: no context "
                        f"parallelism)")
    if cp not in cp_sizes(shape):
        raise GridError(f"context-parallel size cp={cp} does not fit grid {shape}: it splits the tokens z and d shard, "
                        f"so it must divide Gz·Gd = {shape.gz * shape.gd} and divide Gz or be a multiple of it; "
                        f"choose one of {cp_sizes(shape)}")
    return cp


def check_ep(shape: GridShape, ep: int) -> int:
    """``ep`` when it divides Gd; a one-line GridError naming the sizes that work otherwise."""
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise GridError(f"expert-parallel size ep={ep!r} is invalid: it must be an integer >= 1 (1: no expert "
                        f"parallelism)")
    if shape.gd % ep:
        raise GridError(f"expert-parallel size ep={ep} does not divide Gd={shape.gd} of grid {shape}: the experts are "
                        f"spread over the data-parallel ranks; choose ep in "
                        f"{[e for e in range(1, shape.gd + 1) if shape.gd % e == 0]}")
    return ep


def all_shapes(world_size: int) -> Iterable[GridShape]:
    """Every (Gx, Gy, Gz, Gd) whose product is ``world_size``, all divisors included."""
    divs = [v for v in range(1, world_size + 1) if world_size % v == 0]
    for gx in divs:
        for gy in divs:
            for gz in divs:
                rest = world_size // (gx * gy * gz) if world_size % (gx * gy * gz) == 0 else 0
                if rest:
                    yield GridShape(gx, gy, gz, rest)
