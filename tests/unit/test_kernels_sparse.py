"""The sparse compressor (``_compute/sparse.py``, ``pccl_aio.SparseCompressor``): the Cython
kernels (AVX2 loops on and off) write the bytes of the numpy specification, the codes stay
within half a step, error feedback keeps exactly what was not sent, and corrupt parts are
refused."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._compute import sparse
from pccl_aio._compute import sparse_reference as ref
from tests.unit.kernel_harness import CY_IMPLS, kernels

pytestmark = pytest.mark.timeout(60)

CASES = [  # (n, chunk, density, bits): the sampled path, short chunks, odd sizes, all kept
    (70_000, 4096, 0.01, 2), (70_000, 4096, 0.03, 4), (12_345, 1000, 0.01, 4),
    (10_000, 256, 0.05, 2), (5, 4, 1.0, 8), (9_000, 3000, 0.2, 8), (1, 2, 0.5, 2),
]


def vectors(n: int, chunk: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Gaussian; with zeros and ties; a chunk of one repeated value; a zero chunk; a chunk
    whose samples (every chunk // 256-th element) are all it holds of note (the estimate
    is too high and every key is taken); chunks whose scale jumps by 1000x up and down (the
    estimate a chunk takes from the one before is far too low: every key a candidate; or far
    too high: fewer than k candidates, taken again from every key)."""
    x = rng.standard_normal(n).astype(np.float32)
    ties = x.copy()
    ties[: n // 3] = 0
    ties[n // 3: n // 2] = np.float32(1.5)
    flat = np.full(n, np.float32(-0.25))
    zero = x.copy()
    zero[:chunk] = 0
    sampled = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    stride = max(1, chunk // 256)
    sampled[: min(n, chunk): stride][:12] = 100.0
    scales = 10.0 ** (np.arange(n // chunk + 1) % 3 * 3 - 3)
    steps = (x * np.repeat(scales, chunk)[:n]).astype(np.float32)
    return {"gauss": x, "ties": ties, "flat": flat, "zero": zero, "sampled": sampled,
            "steps": steps}


@pytest.fixture(params=["numpy", *(pytest.param(n, marks=pytest.mark.cython) for n in CY_IMPLS)])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The implementation under test (``kernel_harness``: AVX2 loops on or off)."""
    monkeypatch.setattr(sparse, "NO_EXTENSIONS", request.param == "numpy")
    with kernels(request.param):
        yield str(request.param)


@pytest.mark.parametrize(("n", "chunk", "density", "bits"), CASES)
def test_the_kernels_write_the_bytes_of_the_specification(impl, n, chunk, density, bits):
    rng = np.random.default_rng(n + bits)
    lay = sparse.layout(n, density=density, bits=bits, chunk=chunk)
    for name, x in vectors(n, chunk, rng).items():
        want = ref.compress(x, lay)
        got = np.full(lay.nbytes, 0xA5, np.uint8)  # (every byte is written: parts are reused)
        sparse.compress(got, x, lay)
        assert np.array_equal(got, want), name
        base = rng.standard_normal(n).astype(np.float32)
        for sign in (1, -1):
            a, b = base.copy(), base.copy()
            ref.accumulate(a, want, lay, sign)
            sparse.accumulate(b, got, lay, sign)
            assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist(), (name, sign)


def test_the_layout_and_what_is_kept():
    lay = sparse.layout(10_000, density=0.01, bits=2, chunk=4096)
    assert (lay.k, lay.chunks, lay.index_bits, lay.kept) == (41, 3, 12, 41 * 3)
    assert lay.sections == (12, (123 * 12 + 7) // 8, (123 * 2 + 7) // 8)
    lay = sparse.layout(10_000, density=1 / 4096, bits=2, chunk=4096)  # one per chunk
    assert (lay.k, lay.kept, lay.sections) == (1, 3, (12, 5, 1))
    x = np.zeros(10_000, np.float32)
    x[[5, 4000, 4096 + 17, 9999]] = [3.0, -2.0, 1.0, -7.0]
    part = np.zeros(lay.nbytes, np.uint8)
    sparse.compress(part, x, lay)
    out = np.zeros_like(x)
    sparse.accumulate(out, part, lay)
    assert np.flatnonzero(out).tolist() == [5, 4096 + 17, 9999]  # 4000: not the largest
    assert out[[5, 4096 + 17, 9999]].tolist() == [3.0, 1.0, -7.0]  # a chunk's top: exact


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_kept_values_decode_within_half_a_step_and_the_rest_to_zero(impl, bits):
    rng = np.random.default_rng(bits)
    n, chunk = 50_000, 2048
    lay = sparse.layout(n, density=0.02, bits=bits, chunk=chunk)
    x = rng.standard_normal(n).astype(np.float32)
    part = np.zeros(lay.nbytes, np.uint8)
    sparse.compress(part, x, lay)
    out = np.zeros(n, np.float32)
    sparse.accumulate(out, part, lay)
    for j in range(lay.chunks):
        xs, os_ = x[j * chunk:(j + 1) * chunk], out[j * chunk:(j + 1) * chunk]
        kept = np.flatnonzero(os_)  # (no code decodes to 0: the levels are symmetric)
        assert len(kept) == min(lay.k, len(xs))
        assert np.abs(xs[kept]).min() >= np.sort(np.abs(xs))[-len(kept)]  # the largest
        half_step = np.abs(xs).max() / ((1 << bits) - 1) * (1 + 1e-6)
        assert np.all(np.abs(os_[kept] - xs[kept]) <= half_step)


def test_error_feedback_keeps_exactly_what_was_not_sent():
    rng = np.random.default_rng(7)
    n = 30_000
    c = pccl.SparseCompressor(n, density=0.01, bits=2, chunk=1024)
    for _ in range(3):
        before = c.error.copy()
        x = rng.standard_normal(n).astype(np.float32)
        part = c.compress(x)
        assert np.array_equal(c.error, before)  # not yet: only once the exchange succeeded
        sent = np.zeros(n, np.float32)
        sparse.accumulate(sent, part, c.layout)
        c.commit()
        fed = before + x
        kept = sent != 0
        assert np.array_equal(c.error[~kept].view(np.uint32), fed[~kept].view(np.uint32))
        assert np.array_equal(c.error[kept], fed[kept] - sent[kept])
        out = np.empty(n, np.float32)
        c.decompress(part, out)  # alone: the mean of one part is the part
        assert np.array_equal(out, sent)
    c.reset()
    assert not c.error.any() and not c.error.flags.writeable


def test_decay_scales_the_error_before_adding():
    c = pccl.SparseCompressor(4096, density=0.01, bits=4, chunk=4096, decay=0.5)
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    c.compress(x)
    c.commit()
    e = c.error.copy()
    part = c.compress(x)
    sent = np.zeros(4096, np.float32)
    sparse.accumulate(sent, part, c.layout)
    c.commit()
    fed = e * np.float32(0.5) + x
    assert np.array_equal(c.error[sent == 0], fed[sent == 0])
    assert np.array_equal(c.error[sent != 0], fed[sent != 0] - sent[sent != 0])


def test_the_mean_of_parts_is_the_same_bytes_in_rank_order_on_every_peer():
    rng = np.random.default_rng(3)
    n, world = 20_000, 5
    peers = [pccl.SparseCompressor(n, density=0.02, bits=4, chunk=2048) for _ in range(world)]
    parts = [p.compress(rng.standard_normal(n).astype(np.float32)).copy() for p in peers]
    gathered = np.concatenate(parts)
    outs = []
    for p in peers:
        out = np.empty(n, np.float32)
        p.decompress(gathered, out)
        outs.append(out.view(np.uint32).tolist())
    assert all(o == outs[0] for o in outs)
    want = np.zeros(n, np.float32)
    for part in parts:
        ref.accumulate(want, part, peers[0].layout)
    assert np.array_equal(np.asarray(outs[0], np.uint32).view(np.float32), want / np.float32(5))


def test_a_part_with_an_index_outside_its_chunk_is_refused(impl):
    lay = sparse.layout(3000, density=0.01, bits=2, chunk=1000)  # 10 bits: up to 1023
    part = np.zeros(lay.nbytes, np.uint8)
    sparse.compress(part, np.ones(3000, np.float32), lay)
    a, _, _ = lay.sections
    bad = part.copy()
    bad[a] |= 0xFF  # the first index: 1023 and above the chunk
    bad[a + 1] |= 0x03
    with pytest.raises(pccl.RemoteProtocolError, match="outside"):
        sparse.accumulate(np.zeros(3000, np.float32), bad, lay)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_input_is_an_invalid_usage_error(impl, value):
    lay = sparse.layout(5000, density=0.01, bits=2, chunk=1024)
    x = np.ones(5000, np.float32)
    x[4321] = value
    with pytest.raises(pccl.InvalidUsageError, match="not finite"):
        sparse.compress(np.zeros(lay.nbytes, np.uint8), x, lay)


@pytest.mark.parametrize(("kw", "match"), [
    ({"density": 0}, "density"), ({"density": 1.5}, "density"), ({"bits": 3}, "bits"),
    ({"chunk": 1}, "chunk"), ({"chunk": 1 << 17}, "chunk"), ({"decay": 2.0}, "decay"),
])
def test_bad_arguments_are_invalid_usage_errors(kw, match):
    with pytest.raises(pccl.InvalidUsageError, match=match):
        pccl.SparseCompressor(100, **kw)
    c = pccl.SparseCompressor(100)
    with pytest.raises(pccl.InvalidUsageError, match="float32"):
        c.compress(np.zeros(100, np.float64))
    with pytest.raises(pccl.InvalidUsageError, match="parts"):
        c.decompress(np.zeros(c.nbytes + 1, np.uint8), np.zeros(100, np.float32))


@pytest.mark.parametrize("decay", [1.0, 0.9])
def test_the_fed_pass_writes_the_error_feedback_as_numpy_does(impl, decay):
    rng = np.random.default_rng(9)
    n = 40_000
    lay = sparse.layout(n, density=0.02, bits=4, chunk=4096)
    x, err = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    pending = np.full(n, np.nan, np.float32)
    part = np.zeros(lay.nbytes, np.uint8)
    sparse.compress(part, x, lay, error=err, pending=pending, decay=decay)
    want = err * np.float32(decay) + x
    assert pending.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.array_equal(part, ref.compress(want, lay))


def test_a_non_contiguous_out_is_refused_not_written_to_a_copy():
    c = pccl.SparseCompressor(100)
    part = c.compress(np.ones(100, np.float32))
    out = np.zeros((10, 20), np.float32)[:, :10]  # (reshape(-1) would copy it)
    with pytest.raises(pccl.InvalidUsageError, match="C-contiguous"):
        c.decompress(part, out)


@pytest.mark.parametrize(("chunks", "threads"), [(1, 4), (63, 2), (128, 2), (130, 2),
                                                 (200, 3), (1000, 4), (16384, 4), (100, 1)])
def test_the_spans_cover_every_chunk_once_from_multiples_of_eight(chunks, threads):
    lay = sparse.layout(chunks * 16, density=0.2, bits=2, chunk=16)
    spans = sparse.spans(lay, threads)
    assert len(spans) == max(1, min(threads, chunks // sparse.MIN_SPAN))
    assert [a for a, _ in spans[1:]] == [b for _, b in spans[:-1]]  # contiguous
    assert spans[0][0] == 0 and spans[-1][1] == chunks
    assert all(a % 8 == 0 and b > a for a, b in spans)


@pytest.mark.cython
@pytest.mark.parametrize("impl_name", CY_IMPLS)
@pytest.mark.parametrize(("chunk", "density", "bits", "threads"), [
    (256, 0.01, 2, 2), (256, 0.011, 2, 3), (300, 0.05, 4, 4), (4096, 0.01, 2, 2)])
def test_threads_write_the_bytes_of_one(impl_name, chunk, density, bits, threads):
    """Chunk ranges compressed at once by several threads (bit offsets not multiples of 8
    within a span: k * bits odd) give the bytes of one thread, and of the specification,
    the fed pass included; a non-finite value in the last span raises."""
    rng = np.random.default_rng(chunk + threads)
    n = chunk * sparse.MIN_SPAN * threads + chunk // 3
    lay = sparse.layout(n, density=density, bits=bits, chunk=chunk)
    assert len(sparse.spans(lay, threads)) == threads
    with kernels(impl_name):
        for name, x in vectors(n, chunk, rng).items():
            got = np.full(lay.nbytes, 0xA5, np.uint8)  # (every byte is written: parts reused)
            sparse.compress(got, x, lay, threads=threads)
            assert np.array_equal(got, ref.compress(x, lay)), name
        err = rng.standard_normal(n).astype(np.float32)
        pending = np.full(n, np.nan, np.float32)
        sparse.compress(got, x, lay, error=err, pending=pending, decay=0.9, threads=threads)
        want = err * np.float32(0.9) + x
        assert pending.view(np.uint32).tolist() == want.view(np.uint32).tolist()
        assert np.array_equal(got, ref.compress(want, lay))
        x[-1] = np.nan
        with pytest.raises(pccl.InvalidUsageError, match="not finite"):
            sparse.compress(got, x, lay, threads=threads)


@pytest.mark.parametrize("threads", [0, -1, True, 2.0, "2"])
def test_threads_must_be_a_positive_int(threads):
    with pytest.raises(pccl.InvalidUsageError, match="threads"):
        pccl.SparseCompressor(100, threads=threads)


def test_a_compressor_uses_one_thread_per_span():
    small = pccl.SparseCompressor(4096 * 10, threads=4)
    big = pccl.SparseCompressor(4096 * 256, threads=4)
    assert (small.threads, big.threads) == (1, 4)
    assert pccl.SparseCompressor(4096 * 256, threads=1).threads == 1


@pytest.mark.cython
def test_a_child_forked_after_a_threaded_compress_compresses_on_its_own_threads():
    """The pool's threads do not survive a fork: the child makes its own (else it waited for
    threads that are not there)."""
    import os

    lay = sparse.layout(256 * sparse.MIN_SPAN * 2, density=0.01, bits=2, chunk=256)
    x = np.random.default_rng(3).standard_normal(lay.n).astype(np.float32)
    part = np.zeros(lay.nbytes, np.uint8)
    sparse.compress(part, x, lay, threads=2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compress on two threads, write the part, exit
        try:
            got = np.zeros(lay.nbytes, np.uint8)
            sparse.compress(got, x, lay, threads=2)
            os.write(w, got.tobytes())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    assert data == part.tobytes()
