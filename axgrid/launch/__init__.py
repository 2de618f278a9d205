"""Starting and ending a job's processes: who a rank is, how ranks are started here, and how they end.

=================  ===================================================================================
:mod:`.env`        :func:`read_placement` reads rank, world size and local rank from torchrun, mpirun/mpiexec,
                   srun (a table, innermost launcher first: the only place that reads launcher variables);
                   :func:`detect_launch` adds the rendezvous; :func:`init_distributed`
:mod:`.local`      ``axgrid launch -n N -- CMD``: N ranks on this machine (mpiexec or a plain launcher)
:mod:`.proctree`   a launched job's processes, found and ended however deep they are
:mod:`.teardown`   how a rank leaves: at once when it fails, with its groups released when it succeeds
:mod:`.errors`     how a program ends on an error: the project's errors as one line, said once per job
:mod:`.report`     who says a job's failure: the first rank to fail, claimed in the rendezvous store
:mod:`.flight`     the flight recorder: every rank's last collectives, dumped when one fails or hangs, and which
                   ranks stopped at which collective (``python -m axgrid.launch.flight RUN_DIR``)
=================  ===================================================================================

Nothing is imported here, so the launcher (``axgrid launch``) starts without loading torch.
"""
