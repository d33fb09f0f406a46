"""The job's GPUs in NVML: CUDA_VISIBLE_DEVICES (indices, UUIDs, MIG ids) mapped by PCI bus id and
UUID, never by NVML index; the energy meter and the DVFS actuator touch only those GPUs. Against a
fake NVML whose index order is shuffled against PCI bus order."""

import pytest

from harness.gpus import GpuMappingError, job_gpus
from harness.meters import EnergyMeter
from systems.energy_serving.actuator import DvfsActuator

UA, UB, UC = (
    "GPU-aaaaaaaa-0000-0000-0000-000000000001",
    "GPU-bbbbbbbb-0000-0000-0000-000000000002",
    "GPU-cccccccc-0000-0000-0000-000000000003",
)
# NVML index order C, A, B; PCI bus order (= CUDA order for one GPU model) A, B, C
SHUFFLED = [
    (UC, "00000000:88:00.0", "NVIDIA H100", 5000),
    (UA, "00000000:1A:00.0", "NVIDIA H100", 1000),
    (UB, "00000000:3B:00.0", "NVIDIA H100", 3000),
]


def mapped(nv, cvd, ordinals=None, **env):
    env = dict(env, **({"CUDA_VISIBLE_DEVICES": cvd} if cvd is not None else {}))
    return [(g.ordinal, g.nvml_index, g.uuid) for g in job_gpus(nv, ordinals, env)]


@pytest.mark.parametrize(
    "cvd,ordinals,want",
    [
        (None, None, [(0, 1, UA), (1, 2, UB), (2, 0, UC)]),  # every GPU, in CUDA (PCI bus) order
        ("1", None, [(0, 2, UB)]),  # cuda:0 of the job is PCI-second: NVML 2
        ("2,0", None, [(0, 0, UC), (1, 1, UA)]),
        ("2,0", [1], [(1, 1, UA)]),  # the job's cuda:1 only
        (f"{UC},GPU-aaaa", None, [(0, 0, UC), (1, 1, UA)]),  # a full UUID and a unique prefix
        ("1,-1,0", None, [(0, 2, UB)]),  # as CUDA: the list ends at an invalid entry
        ("0,7,1", None, [(0, 1, UA)]),
    ],
)
def test_visible_devices_map_by_pci_bus_and_uuid(fake_nvml, cvd, ordinals, want):
    """Mutations caught: mapping an index entry to NVML's index (``devices[int(entry)]``) gives
    NVML 1 for "1"; ignoring ``ordinals`` returns both GPUs of "2,0"; reading past an invalid entry."""
    assert mapped(fake_nvml(SHUFFLED), cvd, ordinals) == want


@pytest.mark.parametrize(
    "cvd,ordinals,env,match",
    [
        ("MIG-GPU-aaaaaaaa/1/0", None, {}, r"names a MIG instance \(MIG-GPU-aaaaaaaa/1/0\): NVML's energy counter"),
        ("MIG-4f2a9c1e-0000-0000-0000-000000000000", None, {}, "names a MIG instance"),
        ("GPU-dddd", None, {}, "GPU-dddd matches 0 GPUs"),
        ("GPU-", None, {}, "GPU- matches 3 GPUs"),
        ("1,1", None, {}, f"names GPU {UB} twice"),
        ("", None, {}, r"no GPU visible to the job \(CUDA_VISIBLE_DEVICES='', 3 GPUs in NVML\)"),
        ("1", [1], {}, r"GPU index 1 is not allowed: the job sees 1 GPU\(s\), cuda:0..cuda:0"),
    ],
)
def test_unmappable_devices_are_a_clear_error(fake_nvml, cvd, ordinals, env, match):
    with pytest.raises(GpuMappingError, match=match):
        mapped(fake_nvml(SHUFFLED), cvd, ordinals, **env)


def test_mixed_gpu_models_need_pci_bus_order_or_uuids(fake_nvml):
    """CUDA's default order (FASTEST_FIRST) is unknown here when models differ. Mutation caught:
    always assuming PCI bus order (no error, possibly the wrong GPU)."""
    mixed = [SHUFFLED[0], (UA, "00000000:1A:00.0", "NVIDIA A100-SXM4-80GB", 1000), SHUFFLED[2]]
    nv = fake_nvml(mixed)
    with pytest.raises(GpuMappingError, match="set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID"):
        mapped(nv, "1")
    assert mapped(nv, "1", CUDA_DEVICE_ORDER="PCI_BUS_ID") == [(0, 2, UB)]
    assert mapped(nv, UB) == [(0, 2, UB)]


def test_meter_and_actuator_touch_only_the_jobs_gpu(fake_nvml, monkeypatch):
    """CUDA_VISIBLE_DEVICES=1 on a machine whose NVML index 0 is another GPU: energy is read from
    GPU B only (3 J per read, not 1 J or 5 J) and only B's clocks are locked. Mutation caught:
    NVML handles by index (the old ``nvmlDeviceGetHandleByIndex(i) for i in gpu_indices``)."""
    nv = fake_nvml(SHUFFLED)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    m = EnergyMeter(nvml=nv)
    assert m.available and [g.uuid for g in m.gpus] == [UB]
    m.begin_window("run")
    r = m.end_window("run")
    assert r.energy_j == pytest.approx(3.0) and r.per_gpu_j == {0: pytest.approx(3.0)}
    with DvfsActuator(actuate=True, nvml=nv) as a:
        assert a.num_gpus == 1
        a.request(1005, 0.0)
        a.wait()
        assert nv.locked() == {UA: None, UB: (1005, 1005), UC: None}
    assert nv.locked() == {UA: None, UB: None, UC: None}


def test_unmappable_devices_leave_energy_unavailable_and_actuation_off(fake_nvml, monkeypatch):
    nv = fake_nvml(SHUFFLED)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-aaaaaaaa/1/0")
    m = EnergyMeter(nvml=nv)
    m.begin_window("w")
    assert m.end_window("w").energy_j is None and "names a MIG instance" in m.reason
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(900, 0.0)
    a.close()
    assert not a.available and "actuation unavailable: GpuMappingError" in a.reason
    assert a.log == [[0.0, 900.0, False, None]] and nv.state()["log"] == []


def test_inventory_names_every_gpu_by_uuid_and_pci_bus(fake_nvml, monkeypatch):
    """The record's inventory: NVML index, UUID and PCI bus id of every GPU, and the job's
    CUDA_VISIBLE_DEVICES, so a record says which physical GPU cuda:0 was."""
    import sys

    from harness import records

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(SHUFFLED))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    records.hardware_inventory.cache_clear()
    try:
        inv = records.hardware_inventory()
    finally:
        records.hardware_inventory.cache_clear()
    assert inv["cuda_visible_devices"] == "1"
    assert [(g["nvml_index"], g["uuid"], g["pci_bus_id"]) for g in inv["gpus"]] == [
        (0, UC, "00000000:88:00.0"),
        (1, UA, "00000000:1A:00.0"),
        (2, UB, "00000000:3B:00.0"),
    ]
