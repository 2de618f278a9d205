"""The dry run reads ``--overlap`` with the runtime's one parser (``axgrid.OverlapConfig.parse``): every spelling the
drivers take ("off", "none", "", "all", "ALL", comma lists with spaces, "keep") gives the dry run the same switches
for perfmodel's options and the runtime's configuration; a bad one is refused in one line naming it."""
from __future__ import annotations

import pytest

from axgrid.dryrun import DryRunError, resolve
from axgrid.spec import OverlapConfig

SPELLINGS = ["off", "OFF", "none", "", "all", "ALL", "oar", "ors,oag", " oar , odp ", "all,keep", "keep",
             "oar,ors,oag,odp,keep"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_runtime_spelling_of_overlap_works_in_the_dry_run(spelling):
    cfg = resolve("gpt-tiny", None, 4, grid="2x1x2x1", machine="local-4", overlap=spelling, microbatches=1)
    ov, opt = OverlapConfig.parse(spelling), cfg.options()
    assert (opt.overlap_ar, opt.overlap_rs, opt.overlap_ag, opt.overlap_dp, opt.keep_gathered) == \
        (ov.oar, ov.ors, ov.oag, ov.odp, ov.keep_gathered_weights)


def test_a_bad_overlap_is_refused_naming_it():
    with pytest.raises(DryRunError, match=r"--overlap 'oar,bogus': unknown overlap switch\(es\) \['bogus'\]"):
        resolve("gpt-tiny", None, 4, grid="2x1x2x1", machine="local-4", overlap="oar,bogus")
