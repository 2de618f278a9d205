"""Shared by the agreement tests: compare a rank's ledger with perfmodel's prediction, key by key."""


def assert_ledger_matches(got: dict, want_bytes: dict, want_calls: dict, where: str) -> None:
    """``got`` maps (dim, op) -> (calls, bytes) from the runtime ledger; bytes and calls must equal the prediction."""
    assert set(got) == set(want_bytes), f"{where}: (dim, op) keys differ: {sorted(got)} vs {sorted(want_bytes)}"
    for key, (calls, nbytes) in got.items():
        assert (calls, nbytes) == (want_calls[key], want_bytes[key]), \
            f"{where} {key}: ledger {calls} calls / {nbytes} B, perfmodel {want_calls[key]} / {want_bytes[key]} B"
