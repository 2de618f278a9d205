"""axgrid inside other training frameworks. Each integration is an optional extra and imports its framework only
when imported itself:

- :mod:`axgrid.integrations.lightning`: :class:`~axgrid.integrations.lightning.AxgridStrategy`, a Lightning Fabric
  strategy (``pip install axgrid[lightning]``).
"""
