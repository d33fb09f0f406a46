"""harness.run.collector_paused: the cyclic garbage collector off inside a block, as it was after."""
import gc

import pytest

from harness.run import collector_paused


@pytest.fixture
def gc_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_collector_is_off_inside_and_on_again_after_also_when_the_block_raises(gc_on):
    """Mutation caught: re-enabling after the ``yield`` without ``finally`` (a failed run would
    leave the collector off for the rest of a sweep worker's jobs)."""
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failed run")
    assert gc.isenabled()


def test_collector_left_as_it_is_when_not_paused_or_already_off(gc_on):
    """Mutations caught: ``pause`` ignored; the collector turned on after a block it was off before."""
    with collector_paused(False):
        assert gc.isenabled()
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
