"""The pinned host tier's slab: pageable memory registered with CUDA (``cudaHostRegister``) instead of torch's
pinned allocator, locked for exactly its size, released once when the segment closes or is collected, and, where
registration is refused, taken from torch's pinned allocator instead."""

from __future__ import annotations

import gc
import os
import warnings
from pathlib import Path

import pytest
import torch

from elastic_pipe.cache import ActivationCache, CacheError, pinned
from elastic_pipe.cache.layout import SegmentLayout
from elastic_pipe.cache.segments import DeviceSegment


class _FakeRuntime:
    """Records the register and unregister calls a CUDA runtime would get; answers ``rc`` to registrations."""

    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.registered.append((ptr, size, flags))
        return self.rc

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> _FakeRuntime:
    fake = _FakeRuntime()
    monkeypatch.setattr(pinned, "_cudart", lambda: fake)
    return fake


LAYOUT = SegmentLayout((3, 5), torch.float32, 40, 100)


def test_the_slab_is_registered_for_exactly_its_bytes_and_released_once_at_close(runtime: _FakeRuntime) -> None:
    segment = DeviceSegment(LAYOUT, torch.device("cpu"), pin=True)
    ptr = segment._data.data_ptr()
    assert runtime.registered == [(ptr, 40 * 3 * 5 * 4, pinned._PORTABLE_MAPPED)]  # no rounding to a power of two
    assert not segment._data.any()  # every page touched (zero-filled) before it was locked
    keys = torch.tensor([7, 3, 99])
    rows = torch.randn(3, 3, 5)
    segment.write(keys, rows)
    assert torch.equal(segment.read(keys, torch.device("cpu")).values, rows)
    assert runtime.unregistered == []
    segment.close()
    assert runtime.unregistered == [ptr]
    segment.close()
    assert runtime.unregistered == [ptr]  # once


def test_a_segment_collected_without_close_releases_its_lock(runtime: _FakeRuntime) -> None:
    segment = DeviceSegment(LAYOUT, torch.device("cpu"), pin=True)
    ptr = segment._data.data_ptr()
    del segment
    gc.collect()
    assert runtime.unregistered == [ptr]


def test_an_unpinned_or_device_slab_registers_nothing(runtime: _FakeRuntime) -> None:
    DeviceSegment(LAYOUT, torch.device("cpu")).close()
    assert runtime.registered == runtime.unregistered == []


def test_a_refused_registration_falls_back_to_torchs_pinned_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRuntime(rc=1)
    monkeypatch.setattr(pinned, "_cudart", lambda: fake)
    asked: list[bool] = []
    real_empty = torch.empty

    def empty(*args: object, pin_memory: bool = False, **kwargs: object) -> torch.Tensor:
        asked.append(pin_memory)
        return real_empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(pinned.torch, "empty", empty)
    with pytest.warns(RuntimeWarning, match=r"cudaHostRegister refused 64 bytes \(CUDA error 1\)"):
        data, release = pinned.page_locked_empty((4, 2), torch.float64)
    release()
    assert len(fake.registered) == 1  # the registration of the pageable mapping was tried first
    assert asked == [True]  # then torch's pinned allocator, once
    assert data.shape == (4, 2) and data.dtype == torch.float64
    assert fake.unregistered == []  # nothing was registered, so nothing is released


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_registered_slab_is_pinned_copies_by_dma_and_is_unlocked_at_close() -> None:
    segment = DeviceSegment(LAYOUT, torch.device("cpu"), pin=True)
    assert segment._data.is_pinned()
    held = segment._data
    keys = torch.arange(10)
    rows = torch.randn(10, 3, 5, device="cuda")
    segment.write(keys, rows)
    back = segment.read(keys, torch.device("cuda")).values
    torch.cuda.synchronize()
    assert torch.equal(back, rows)
    segment.close()
    assert not held.is_pinned()  # the lock went with the segment; the memory lives on with the reference


def _mapped(address: int) -> bool:
    """Whether ``address`` lies in one of this process's mappings."""
    with open("/proc/self/maps", encoding="ascii") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the Linux process maps")
def test_a_forked_child_such_as_a_loader_worker_does_not_inherit_the_slab(runtime: _FakeRuntime) -> None:
    """Linux copies pinned pages into a child at fork, so each DataLoader worker forked after the lock would hold
    a copy of the whole slab; the slab is left out of children instead (the parent keeps using it)."""
    data, release = pinned.page_locked_empty((1024, 256), torch.float32)
    gc.collect()  # the tensor alone keeps its mapping alive
    data[-1, -1] = 3.0
    address = data.data_ptr()
    assert _mapped(address)
    with warnings.catch_warnings():  # Python >= 3.12 warns of forking a process with threads (torch's): the
        warnings.simplefilter("ignore", DeprecationWarning)  # child only reads its maps and exits
        pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        os._exit(0 if not _mapped(address) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(data[-1, -1]) == 3.0
    release()
    assert runtime.unregistered == [address]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_transform_of_the_pinned_slab_with_copies_beside_the_compute_is_exact() -> None:
    """Runs of consecutive slots go in and out on side streams while the compute runs; a key mask that breaks the
    runs sends the rest through the staged gather; every entry comes back exactly transformed, once."""
    layout = SegmentLayout((4, 8), torch.float32, 500, 600)
    segment = DeviceSegment(layout, torch.device("cpu"), pin=True)
    keys = torch.randperm(600, generator=torch.Generator().manual_seed(1))[:500]
    rows = torch.randn(500, 4, 8)
    for lo in range(0, 500, 64):
        segment.write(keys[lo : lo + 64], rows[lo : lo + 64].cuda())
    torch.cuda.synchronize()
    weight = torch.randn(8, 8, device="cuda")
    seen: list[str] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.device.type)
        for _ in range(20):  # long enough that the next chunk's copy runs beside it
            x = x @ weight / 8**0.5
        return x

    expected = rows.cuda()
    for _ in range(20):
        expected = expected @ weight / 8**0.5
    assert segment.transform(fn, 48, torch.device("cuda")) == 500
    got = segment.read(keys, torch.device("cuda")).values
    torch.cuda.synchronize()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert set(seen) == {"cuda"} and len(seen) == 11  # ceil(500 / 48) chunks, each once
    keep = torch.zeros(600, dtype=torch.bool)
    keep[keys[::3]] = True  # every third entry: chunks of scattered slots, through the staged gather
    before = segment.read(keys, torch.device("cpu")).values
    segment.transform(lambda x: x + 1, 16, torch.device("cuda"), keep)
    found = segment.read(keys, torch.device("cpu"))
    assert torch.equal(found.found, keep[keys])
    assert torch.equal(found.values, before[keep[keys]] + 1)
    segment.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_refused_registration_leaves_no_error_for_the_next_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real refusal (the memory is registered already), whose error the runtime keeps as its last one: the
    fallback clears it, so the next kernel launch does not raise it as its own."""
    real = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    held = pinned._unforked(1 << 20)  # page-aligned
    assert int(real.cudaHostRegister(held.data_ptr(), held.numel(), 0)) == 0

    class _Twice:
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
            return int(real.cudaHostRegister(held.data_ptr(), held.numel(), flags))  # already registered

    monkeypatch.setattr(pinned, "_cudart", _Twice)
    try:
        with pytest.warns(RuntimeWarning, match="cudaHostRegister refused"):
            data, _ = pinned.page_locked_empty((16, 4), torch.float32)
        assert data.is_pinned()  # torch's pinned allocator
        assert float((torch.ones(8, device="cuda") * 2).sum()) == 16.0
    finally:
        real.cudaHostUnregister(held.data_ptr())


def test_a_slab_larger_than_the_hosts_available_memory_is_refused_by_name(
    runtime: _FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Touching more pages than the host has would get the process killed for memory with no message: the slab
    is refused first, naming the sizes and what to change; nothing is registered."""
    monkeypatch.setattr(pinned, "available_bytes", lambda: 1000)
    with pytest.raises(CacheError, match=r"needs 2400 bytes .* host has 1000 available .*cache_tiers\.host"):
        DeviceSegment(LAYOUT, torch.device("cpu"), pin=True)
    assert runtime.registered == []
    monkeypatch.setattr(pinned, "available_bytes", lambda: 2400)
    DeviceSegment(LAYOUT, torch.device("cpu"), pin=True).close()  # exactly enough
    assert len(runtime.registered) == 1


def test_available_bytes_reads_memavailable(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    8000 kB\n")
    assert pinned.available_bytes(str(meminfo)) == 8000 * 1024
    meminfo.write_text("MemTotal:       16000 kB\n")
    assert pinned.available_bytes(str(meminfo)) is None
    assert pinned.available_bytes(str(tmp_path / "absent")) is None
    if Path("/proc/meminfo").exists():
        real = pinned.available_bytes()
        assert real is not None and real > 0


def test_a_private_host_tier_after_the_device_tier_takes_only_the_keys_the_device_cannot_hold() -> None:
    entry = 4 * 4
    cache = ActivationCache(10, device_budget=4 * entry, host_budget=100 * entry, host_kind="pinned")
    ids = torch.arange(10)
    values = ids.float()[:, None] * torch.ones(4)
    assert cache.put(ids, 1, values) == 10
    assert [(t.name, t.entries, t.used_bytes) for t in cache.stats.tiers] == [
        ("device", 4, 4 * entry),
        ("host", 6, 6 * entry),  # not a slot per key: the device tier holds 4 of them
    ]
    cache.close()


def test_no_device_view_is_made_for_a_cpu_reader_or_pageable_memory() -> None:
    """A view on the GPU exists only for page-locked host memory read by a GPU; a CPU reader reads the slab itself."""
    assert pinned.device_view(torch.zeros(4), torch.device("cpu")) is None
    assert pinned.device_view(torch.zeros(4), torch.device("cuda")) is None  # pageable (or no CUDA at all)
    assert pinned.device_view(torch.zeros(0), torch.device("cuda")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_a_read_through_the_device_view_equals_the_copies_and_aliases_the_slab(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The pinned host slab read by one gather kernel on its device view (``HOST_READS = "mapped"``) returns what
    one copy per run of slots returns, and the view is the slab's own memory (a host write shows through it, no
    copy was made); closing the segment drops the view before it unlocks the slab."""
    from elastic_pipe.cache import segments

    device = torch.device("cuda")
    layout = SegmentLayout((3, 5), dtype, 64, 100)
    segment = DeviceSegment(layout, torch.device("cpu"), pin=True)
    keys = torch.randperm(100)[:64]
    rows = torch.randn(64, 3, 5).to(dtype)
    segment.write(keys, rows)
    wanted = keys[torch.tensor([5, 0, 63, 7, 8, 9, 31])]
    mapped = segment.read(wanted, device)
    view = segment._mapped[device]
    assert view is not None and view.device.type == "cuda" and view.data_ptr() == segment._data.data_ptr()
    monkeypatch.setattr(segments, "HOST_READS", "copies")
    copied = segment.read(wanted, device)
    assert mapped.values.device.type == "cuda" and mapped.values.dtype == dtype
    assert torch.equal(mapped.values, copied.values) and torch.equal(mapped.found, copied.found)
    assert torch.equal(mapped.values.cpu(), rows[[5, 0, 63, 7, 8, 9, 31]])
    segment._data[0].fill_(7)  # the host writes the slab: the GPU sees it through the view
    torch.testing.assert_close(view[0].float().cpu(), torch.full((3, 5), 7.0))
    segment.close()
    assert segment._mapped == {}
