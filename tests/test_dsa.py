"""Intel DSA: discovery without a device falls back to the CPU, and the
descriptors/completion records match the kernel's linux/idxd.h byte for byte."""

import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import kvcore
from kvcore import _native

IDXD_H = Path("/usr/include/linux/idxd.h")

C_PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <linux/idxd.h>

static void dump(const char *name, const void *p, size_t n) {
    printf("%s ", name);
    for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
    printf("\n");
}

int main(void) {
    printf("desc_size %zu\n", sizeof(struct dsa_hw_desc));
    printf("desc.completion_addr %zu\n", offsetof(struct dsa_hw_desc, completion_addr));
    printf("desc.src_addr %zu\n", offsetof(struct dsa_hw_desc, src_addr));
    printf("desc.dst_addr %zu\n", offsetof(struct dsa_hw_desc, dst_addr));
    printf("desc.xfer_size %zu\n", offsetof(struct dsa_hw_desc, xfer_size));
    printf("desc.int_handle %zu\n", offsetof(struct dsa_hw_desc, int_handle));
    printf("desc.op_specific %zu\n", offsetof(struct dsa_hw_desc, op_specific));
    printf("comp_size %zu\n", sizeof(struct dsa_completion_record));
    printf("comp.status %zu\n", offsetof(struct dsa_completion_record, status));
    printf("comp.result %zu\n", offsetof(struct dsa_completion_record, result));
    printf("comp.bytes_completed %zu\n", offsetof(struct dsa_completion_record, bytes_completed));
    printf("comp.fault_addr %zu\n", offsetof(struct dsa_completion_record, fault_addr));
    printf("op_memmove %d\n", DSA_OPCODE_MEMMOVE);
    printf("op_batch %d\n", DSA_OPCODE_BATCH);
    printf("flag_crav %d\n", IDXD_OP_FLAG_CRAV);
    printf("flag_rcr %d\n", IDXD_OP_FLAG_RCR);
    printf("flag_cc %d\n", IDXD_OP_FLAG_CC);
    printf("flag_bof %d\n", IDXD_OP_FLAG_BOF);

    struct dsa_hw_desc d;
    memset(&d, 0, sizeof d);
    d.opcode = DSA_OPCODE_MEMMOVE;
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_CC;
    d.completion_addr = 0x1122334455667780ull;
    d.src_addr = 0x00007f0012345678ull;
    d.dst_addr = 0x00007f00abcdef01ull;
    d.xfer_size = 0x00123457u;
    dump("memmove", &d, sizeof d);

    memset(&d, 0, sizeof d);
    d.opcode = DSA_OPCODE_BATCH;
    d.flags = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR;
    d.completion_addr = 0x0000555500001000ull;
    d.desc_list_addr = 0x0000555500002040ull;
    d.desc_count = 17;
    dump("batch", &d, sizeof d);

    struct dsa_completion_record c;
    memset(&c, 0, sizeof c);
    c.status = DSA_COMP_PAGE_FAULT_NOBOF | DSA_COMP_STATUS_WRITE;
    c.result = 0;
    c.bytes_completed = 0x3000;
    c.fault_addr = 0x00007f00abcf0000ull;
    dump("comp", &c, sizeof c);
    return 0;
}
"""


@pytest.fixture(scope="module")
def kernel_layout(tmp_path_factory):
    if not IDXD_H.exists():
        pytest.skip("linux/idxd.h is not installed (Debian package linux-libc-dev)")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read linux/idxd.h with")
    d = tmp_path_factory.mktemp("idxd")
    (d / "layout.c").write_text(C_PROGRAM)
    subprocess.run([cc, "-O0", "-o", str(d / "layout"), str(d / "layout.c")], check=True, capture_output=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def test_descriptor_and_record_layout_match_the_kernel_header(kernel_layout):
    ours = _native.dsa_layout()
    for key, value in kernel_layout.items():
        if key in ("memmove", "batch", "comp"):
            continue
        assert ours[key] == int(value), key
    assert ours["desc_align"] == 64 and ours["comp_align"] == 32


def test_memmove_descriptor_bytes_match_the_kernel_header(kernel_layout):
    L = _native.dsa_layout()
    ours = _native.dsa_build_memmove(
        0x00007F0012345678, 0x00007F00ABCDEF01, 0x00123457, 0x1122334455667780, L["flag_crav"] | L["flag_rcr"] | L["flag_cc"]
    )
    assert ours.hex() == kernel_layout["memmove"]


def test_batch_descriptor_bytes_match_the_kernel_header(kernel_layout):
    L = _native.dsa_layout()
    ours = _native.dsa_build_batch(0x0000555500002040, 17, 0x0000555500001000, L["flag_crav"] | L["flag_rcr"])
    assert ours.hex() == kernel_layout["batch"]


def test_completion_record_parsing_matches_the_kernel_header(kernel_layout):
    rec = _native.dsa_parse_completion(bytes.fromhex(kernel_layout["comp"]))
    assert rec["status"] == 3 and rec["status_name"] == "page-fault-nobof"
    assert rec["write_fault"] is True
    assert rec["bytes_completed"] == 0x3000 and rec["fault_addr"] == 0x00007F00ABCF0000
    with pytest.raises(kvcore.InvalidArgumentError):
        _native.dsa_parse_completion(b"short")


def test_discovery_without_the_library_reports_why():
    d = _native.dsa_discover("libaccel-config-missing.so.1")
    assert d["library_loaded"] is False and d["queues"] == []
    assert "not loadable" in d["reason"]


def test_discovery_with_no_device_finds_nothing_and_cpu_is_used():
    d = _native.dsa_discover()
    if d["queues"]:
        pytest.skip("this machine has a usable DSA work queue")
    assert d["reason"]  # says why: no library, no device/queue, or no MOVDIR64B/ENQCMD
    f = kvcore.features()
    assert "dsa" not in f["copy_engines"] and f["dsa"]["available"] is False
    assert f["dsa"]["reason"] == _native.dsa_status()["reason"]
    assert (f["dsa"]["timeouts"], f["dsa"]["overdue_descriptors"], f["dsa"]["cpu_fallbacks"]) == (0, 0, 0)
    # auto falls back to the CPU without error; an explicit engine="dsa" says why it cannot
    src = np.arange(1 << 20, dtype=np.uint32)
    dst = np.empty_like(src)
    kvcore.copy_async(dst, src, engine="auto").result()
    assert np.array_equal(dst, src)
    assert _native.mover_engine_for(64 << 20, 1, 0) == "cpu"
    with pytest.raises(kvcore.UnsupportedError, match="dsa"):
        kvcore.copy_async(dst, src, engine="dsa")


def test_dsa_engine_copies_when_a_queue_exists():
    """Runs only on a machine with an enabled user-mode DSA work queue."""
    if not _native.dsa_status()["available"]:
        pytest.skip("no usable DSA work queue on this machine")
    rng = np.random.default_rng(0)
    for size in (1, 4096, 65537, 3 << 20, 40 << 20):
        src = rng.integers(0, 256, size, dtype=np.uint8)
        dst = np.zeros_like(src)
        kvcore.copy_async(dst, src, engine="dsa").result()
        assert np.array_equal(dst, src)
    kv = rng.integers(0, 256, (64, 32 * 1024), dtype=np.uint8)
    out = kvcore.gather(kv, list(range(0, 64, 3)), engine="dsa").result()
    assert np.array_equal(out, kv[::3])
    # fresh (never touched) destination pages exercise the page-fault path
    fresh = np.empty(8 << 20, np.uint8)
    kvcore.copy_async(fresh, np.ones(8 << 20, np.uint8), engine="dsa").result()
    assert int(fresh.min()) == 1


def test_auto_engine_moves_an_overlapping_copy_on_a_dsa_machine():
    """engine="auto" chose DSA for a large copy that overlaps its own source, which DSA
    refuses: the memmove that the CPU engine does failed on DSA machines alone.
    Runs only on a machine with an enabled user-mode DSA work queue."""
    if not _native.dsa_status()["available"]:
        pytest.skip("no usable DSA work queue on this machine")
    a = np.arange(8 << 20, dtype=np.uint8)
    expect = a.copy()
    expect[4096:] = a[:-4096].copy()
    kvcore.copy_async(a[4096:], a[:-4096]).result()
    assert np.array_equal(a, expect)


def _addrs(arrays):
    return np.array([a.__array_interface__["data"][0] for a in arrays], np.uint64)


@pytest.mark.parametrize("dedicated", [True, False])
@pytest.mark.parametrize(
    "max_batch,max_transfer,fault_every,fault_after",
    [(32, 1 << 20, 0, 0), (4, 64 << 10, 0, 0), (8, 256 << 10, 3, 4096), (2, 1 << 20, 1, 100), (1, 1 << 20, 2, 7)],
)
def test_engine_on_an_emulated_queue(dedicated, max_batch, max_transfer, fault_every, fault_after):
    """The submission, batching (several batches in flight), transfer splitting
    and page-fault recovery (touch + resubmit the rest) of the DSA engine, run
    against a software queue that checks descriptors like the device does."""
    rng = np.random.default_rng(max_batch * 100 + fault_every)
    sizes = [int(s) for s in rng.integers(1, 300_000, 40)] + [0, 3 << 20, 32 << 10]
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    dsts = [np.zeros(n, np.uint8) for n in sizes]
    stats = _native.dsa_emulated_copy(
        _addrs(dsts), _addrs(srcs), np.array(sizes, np.uint64), max_batch, max_transfer, fault_every, fault_after, dedicated
    )
    for d, s in zip(dsts, srcs):
        assert np.array_equal(d, s)
    assert stats["errors"] == 0  # no descriptor broke a device rule
    assert stats["faults_handled"] == stats["faults_injected"]
    if max_batch > 1:
        assert stats["batches"] >= 1
    else:
        assert stats["batches"] == 0
    if fault_every:
        assert stats["faults_injected"] > 0


@pytest.mark.parametrize("wq_size", [1, 2, 3])
def test_a_dedicated_queue_smaller_than_the_batch_window(wq_size):
    """A dedicated queue of fewer entries than the batches the engine keeps in flight (4):
    the engine spun forever waiting for a slot that only its own batches, not yet
    finished, held (a thread that holds slots now finishes a batch instead)."""
    sizes = [100_000] * 64  # 8 batches of 8
    srcs = [np.full(n, i, np.uint8) for i, n in enumerate(sizes)]
    dsts = [np.zeros(n, np.uint8) for n in sizes]
    stats = {}

    def run():
        stats.update(_native.dsa_emulated_copy(
            _addrs(dsts), _addrs(srcs), np.array(sizes, np.uint64), 8, 1 << 20, 5, 1000, True, wq_size))

    worker = threading.Thread(target=run, daemon=True)  # (the GIL is released while it copies)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the DSA engine deadlocked on its own queue slots"
    assert stats["batches"] >= 8 and stats["errors"] == 0 and stats["faults_injected"] > 0
    for d, s in zip(dsts, srcs):
        assert np.array_equal(d, s)


def test_emulated_queue_that_always_faults_finishes_on_the_cpu():
    src = np.arange(1 << 16, dtype=np.uint8)
    dst = np.zeros_like(src)
    stats = _native.dsa_emulated_copy(_addrs([dst]), _addrs([src]), np.array([src.nbytes], np.uint64), 32, 1 << 20, 1, 0)
    assert np.array_equal(dst, src)
    assert stats["faults_injected"] >= 256  # gave up resubmitting, then copied the rest itself


def _blocks(count, size, seed):
    rng = np.random.default_rng(seed)
    srcs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(count)]
    return srcs, [np.zeros(size, np.uint8) for _ in range(count)]


def _copy_on(engine, dsts, srcs):
    engine.copy(_addrs(dsts), _addrs(srcs), np.array([s.nbytes for s in srcs], np.uint64))


def _copy_within(engine, dsts, srcs, seconds):
    """Copies on a thread (the GIL is released while it copies); False if it did not end."""
    worker = threading.Thread(target=_copy_on, args=(engine, dsts, srcs), daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def test_descriptors_that_never_complete_do_not_wedge_a_dedicated_queue():
    """A descriptor that timed out kept its entry of a dedicated work queue for good: once as
    many had timed out as the queue has entries, every later DSA copy spun forever waiting
    for one. The entries stay held while the device may still run the descriptor, but a
    copy that finds every entry held that way runs on the CPU."""
    engine = _native.DsaEmulatedEngine(max_batch=4, wq_size=2, stall_first=2, stall_ms=0, timeout_ms=50)
    srcs, dsts = _blocks(16, 50_000, 1)
    # DeviceTimeoutError (a BackendError): the device may still run it, so a Future of such a
    # copy keeps its buffers (test_copy.py::test_a_copy_the_device_may_still_run_keeps_its_buffers)
    with pytest.raises(kvcore.DeviceTimeoutError, match="did not complete in 50 ms"):
        _copy_on(engine, dsts, srcs)  # its first two batches hang in the device
    s = engine.stats()
    assert (s["stalled"], s["timeouts"], s["overdue_descriptors"], s["wedged_queues"]) == (2, 2, 2, 1)
    for _ in range(3):
        srcs, dsts = _blocks(16, 50_000, 2)
        assert _copy_within(engine, dsts, srcs, 30), "a DSA copy waited forever for a queue entry"
        assert all(np.array_equal(d, s) for d, s in zip(dsts, srcs))
    s = engine.stats()
    assert s["cpu_fallbacks"] == 3 and s["descriptors"] == 0 and s["overdue_descriptors"] == 2


def test_a_descriptor_that_completes_late_returns_its_entry():
    """The device may finish a timed-out descriptor later: it writes the data and the
    completion record into memory the engine kept, and the entry is used again."""
    engine = _native.DsaEmulatedEngine(max_batch=4, wq_size=2, stall_first=2, stall_ms=0, timeout_ms=50)
    srcs, dsts = _blocks(16, 50_000, 3)
    with pytest.raises(kvcore.DeviceTimeoutError, match="did not complete"):
        _copy_on(engine, dsts, srcs)
    assert engine.stats()["overdue_descriptors"] == 2
    engine.complete_held()  # the device finishes them now, long after the engine gave up
    s = engine.stats()
    assert (s["late_completions"], s["overdue_descriptors"], s["wedged_queues"]) == (2, 0, 0)
    assert all(np.array_equal(d, s) for d, s in zip(dsts[:8], srcs[:8]))  # the two late batches
    srcs, dsts = _blocks(16, 50_000, 4)
    assert _copy_within(engine, dsts, srcs, 30)
    assert all(np.array_equal(d, s) for d, s in zip(dsts, srcs))
    s = engine.stats()
    assert s["cpu_fallbacks"] == 0 and s["descriptors"] == 8 + 16 and s["errors"] == 0


def test_a_shared_queue_keeps_copying_after_a_timeout():
    """A shared queue has no entries of the engine's to run out of: the timed-out descriptor's
    memory is kept until it completes, and later copies still go to the device."""
    engine = _native.DsaEmulatedEngine(max_batch=4, dedicated=False, stall_first=1, stall_ms=0, timeout_ms=50)
    srcs, dsts = _blocks(2, 50_000, 5)
    with pytest.raises(kvcore.BackendError, match="did not complete"):
        _copy_on(engine, dsts, srcs)
    srcs, dsts = _blocks(16, 50_000, 6)
    assert _copy_within(engine, dsts, srcs, 30)
    assert all(np.array_equal(d, s) for d, s in zip(dsts, srcs))
    s = engine.stats()
    assert (s["overdue_descriptors"], s["wedged_queues"], s["cpu_fallbacks"], s["descriptors"]) == (1, 0, 0, 16)
