"""Exceptions raised by perfmodel (all subclass ValueError so callers can catch one type)."""


class PerfModelError(ValueError):
    """Bad input to the performance model (unknown name, impossible configuration, ...)."""


class MachineFileError(PerfModelError):
    """A machine file is missing, malformed, or lacks a required field (the message names both)."""


class NoFeasibleConfig(PerfModelError):
    """Every grid configuration was rejected; the message summarises the reasons."""
