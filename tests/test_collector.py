"""harness.process.collector_paused: the cyclic garbage collector off inside a block, as it was after."""

import gc

import pytest

from harness.process import collector_paused


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


def test_end_startup_freezes_the_start_up_objects_and_turns_the_collector_on(gc_on):
    """run.py starts with the collector off; harness.process.end_startup ends that once. Mutations
    caught: the collector left off; nothing frozen; a collector that is on frozen again."""
    from harness.process import end_startup

    try:
        gc.unfreeze()
        gc.disable()
        end_startup()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        gc.unfreeze()
        end_startup()  # already on: nothing to do
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_run_and_sweep_hooks_end_the_start_up(monkeypatch):
    """OutputDirCheck's hooks end the start-up before a single run and before a sweep (a parallel
    sweep's driver never calls run.py's main(): without the multirun hook its collector stayed off
    for the whole sweep). Mutation caught: either hook not calling end_startup."""
    import harness.folders as hr

    calls = []
    monkeypatch.setattr(hr, "end_startup", lambda: calls.append(1))
    monkeypatch.setattr(hr.OutputDirCheck, "_check", staticmethod(lambda config, key: None))
    monkeypatch.setattr(hr.OutputDirCheck, "new_run_dir", None)
    hr.OutputDirCheck().on_run_start(None)
    assert calls == [1]
    hr.OutputDirCheck().on_multirun_start(None)
    assert calls == [1, 1]
