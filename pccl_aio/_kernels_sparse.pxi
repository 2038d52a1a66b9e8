# Sparse compression: chunked top-k, 2/4/8-bit codes, bit-packed indices
# (``_compute/sparse_reference.py`` is the specification; included by ``_kernels.pyx``).

cdef extern from "_kernels_sparse.h" nogil:
    Py_ssize_t pccl_simd_gather(const uint32_t* raw, Py_ssize_t m, uint32_t est, uint32_t* ck,
                                uint32_t* ci, Py_ssize_t* count)
    Py_ssize_t pccl_simd_feed_top(float* p, const float* src, const float* err, float decay,
                                  Py_ssize_t m, uint32_t est, uint32_t* ck, uint32_t* ci,
                                  Py_ssize_t* count, uint32_t* top)
#
# The k largest magnitudes of a chunk: one pass keeps the keys (the bits of |x|) at or above
# an estimate, in index order: the previous chunk's threshold lowered (``_lowered``), in the
# pass that also writes the error feedback (``_feed_top``), or, for the first chunk and after
# an estimate too high, one from a sample (``_candidates``); the k-th largest of those is
# the threshold T (quickselect, or a radix select on the bits when many: digits of 11, 11
# and 9 bits from bit 30 down, bit 31 of |x| being 0); keys above T are kept, and keys equal
# to T in index order until k are (ties: the lower indices).


cdef float ESTIMATE_SCALE = 0.92  # see _lowered


cdef struct BitWriter:
    unsigned char* p
    uint64_t acc
    int n


cdef struct BitReader:
    const unsigned char* p
    uint64_t acc
    int n


cdef inline void _put(BitWriter* w, uint64_t v, int bits) noexcept nogil:
    w.acc |= v << w.n
    w.n += bits
    while w.n >= 8:
        w.p[0] = <unsigned char>(w.acc & 0xFF)
        w.p += 1
        w.acc >>= 8
        w.n -= 8


cdef inline void _flush(BitWriter* w) noexcept nogil:
    if w.n > 0:
        w.p[0] = <unsigned char>(w.acc & 0xFF)


cdef inline uint64_t _get(BitReader* r, int bits) noexcept nogil:
    cdef uint64_t v
    while r.n < bits:
        r.acc |= (<uint64_t>r.p[0]) << r.n
        r.p += 1
        r.n += 8
    v = r.acc & (((<uint64_t>1) << bits) - 1)
    r.acc >>= bits
    r.n -= bits
    return v


cdef Py_ssize_t _threshold(const uint32_t* keys, Py_ssize_t m, Py_ssize_t k,
                           int64_t* t_out) noexcept nogil:
    """The k-th largest of ``keys[:m]`` as ``t_out`` and how many keys equal to it are taken;
    or, when a whole digit bucket completes the k, ``t_out`` one below its lowest key and 0."""
    cdef uint32_t hist[2048]
    cdef uint32_t prefix = 0, mask = 0, key, dmask
    cdef Py_ssize_t remaining = k, i
    cdef int level, shift, b
    for level in range(3):
        shift = 20 if level == 0 else 9 if level == 1 else 0
        dmask = 0x7FF if level < 2 else 0x1FF
        memset(hist, 0, (dmask + 1) * sizeof(uint32_t))
        for i in range(m):
            key = keys[i]
            if (key & mask) == prefix:
                hist[(key >> shift) & dmask] += 1
        b = <int>dmask
        while hist[b] < remaining:
            remaining -= hist[b]
            b -= 1
        prefix |= (<uint32_t>b) << shift
        mask |= dmask << shift
        if hist[b] == remaining:  # the whole bucket: every key >= prefix
            t_out[0] = <int64_t>prefix - 1
            return 0
    t_out[0] = prefix
    return remaining


cdef uint32_t _kth_largest(uint32_t* a, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """The k-th largest of ``a[:n]`` (1 <= k <= n; quickselect, reorders ``a``)."""
    cdef Py_ssize_t lo = 0, hi = n - 1, i, j, target = k - 1
    cdef uint32_t p, x, y, z, tmp
    while lo < hi:
        x, y, z = a[lo], a[(lo + hi) // 2], a[hi]  # the median of three as the pivot
        p = y if (x >= y) == (y >= z) else x if (y >= x) == (x >= z) else z
        i, j = lo, hi
        while i <= j:
            while a[i] > p:
                i += 1
            while a[j] < p:
                j -= 1
            if i <= j:
                tmp = a[i]
                a[i] = a[j]
                a[j] = tmp
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break
    return a[target]


cdef uint32_t _feed_top(float* p, const float* src, const float* err, float decay,
                        Py_ssize_t m, uint32_t est, uint32_t* ck, uint32_t* ci,
                        Py_ssize_t* count) noexcept nogil:
    """With ``src`` (not NULL), ``p[:m] = err * decay + src`` (``_feed``); returns the largest
    key (``|x|`` bits) of ``p[:m]``; with ``est`` > 0 also the values whose keys are at or
    above it (their bits), to ``ck``, and their indices, to ``ci``, in index order, their number to ``count``. One pass (AVX2,
    the tail here), which also brings the chunk into the cache for the selection."""
    cdef uint32_t hi, key
    cdef const uint32_t* raw = <const uint32_t*>p
    cdef Py_ssize_t i, c
    cdef Py_ssize_t done = pccl_simd_feed_top(p, src, err, decay, m, est, ck, ci, &c, &hi)
    if src != NULL:
        _feed(p + done, src + done, err + done, decay, m - done)
    for i in range(done, m):
        key = raw[i] & 0x7FFFFFFF
        hi = key if key > hi else hi
        if est != 0 and key >= est:
            ck[c] = raw[i]
            ci[c] = <uint32_t>i
            c += 1
    count[0] = c
    return hi


cdef uint32_t _lowered(int64_t t) noexcept nogil:
    """The next chunk's estimate from this one's threshold key ``t``: its magnitude times
    ``ESTIMATE_SCALE`` (neighbouring chunks of a gradient look alike: about twice k keys lie
    above it; fewer than k only where the scale of the values jumps), as a key; 0: none."""
    cdef uint32_t key
    cdef float f
    if t <= 0:
        return 0
    key = <uint32_t>t
    memcpy(&f, &key, 4)
    f = f * ESTIMATE_SCALE
    memcpy(&key, &f, 4)
    return key


cdef Py_ssize_t _candidates(const uint32_t* raw, Py_ssize_t m, Py_ssize_t k, uint32_t* ck,
                            uint32_t* ci, uint32_t* tmp, uint32_t hi) noexcept nogil:
    """The values (``ck``: their bits, sign included; the key is ``& 0x7FFFFFFF``) and
    indices (``ci``) of the chunk ``raw[:m]`` whose keys are at or above an
    estimate of its k-th largest magnitude (from 256 evenly spaced samples, set three times
    lower than the k of them expected), in index order; their count. ``hi``: the chunk's
    largest key (finite). The estimate may be too high: fewer than k candidates (the caller
    then takes every key). Small chunks and high densities take every key at once. The
    gathering pass: AVX2, or eight keys per branch."""
    cdef Py_ssize_t c = 0, i, j, ks, stride, blocks, done
    cdef uint32_t key, est = 0, hit
    if m >= 1024 and 8 * k <= m:
        stride = m // 256
        ks = 2 + (3 * k * 256 + m - 1) // m
        est = _kth_of_sample(raw, stride, ks if ks < 64 else 64, tmp)
    done = pccl_simd_gather(raw, m, est, ck, ci, &c)  # (AVX2: eight keys per compare)
    blocks = done + (m - done) - (m - done) % 8
    for i in range(done, blocks, 8):  # eight keys at a time: most blocks hold no candidate
        hit = 0
        for j in range(8):
            hit |= (raw[i + j] & 0x7FFFFFFF) >= est
        if hit:
            for j in range(i, i + 8):
                key = raw[j] & 0x7FFFFFFF
                if key >= est:
                    ck[c] = raw[j]
                    ci[c] = <uint32_t>j
                    c += 1
    for i in range(blocks, m):
        key = raw[i] & 0x7FFFFFFF
        if key >= est:
            ck[c] = raw[i]
            ci[c] = <uint32_t>i
            c += 1
    return c


cdef uint32_t _kth_of_sample(const uint32_t* raw, Py_ssize_t stride, Py_ssize_t ks,
                             uint32_t* best) noexcept nogil:
    """The ks-th largest (ks <= 64) of the 256 keys ``raw[i * stride] & 0x7FFFFFFF``: the
    ks largest kept sorted (descending) in ``best``, each sample compared with the least."""
    cdef Py_ssize_t i, j, have = 0
    cdef uint32_t key
    for i in range(256):
        key = raw[i * stride] & 0x7FFFFFFF
        if have == ks:
            if key <= best[ks - 1]:
                continue
            j = ks - 1
        else:
            j = have
            have += 1
        while j > 0 and best[j - 1] < key:
            best[j] = best[j - 1]
            j -= 1
        best[j] = key
    return best[ks - 1]


cdef void _feed(float* pending, const float* x, const float* err, float decay,
                Py_ssize_t n) noexcept nogil:
    """``pending = err * decay + x`` (float32, each product rounded: numpy's order)."""
    cdef Py_ssize_t i
    cdef float t
    for i in range(n):
        t = err[i] * decay
        pending[i] = t + x[i]


cdef Py_ssize_t _compress(unsigned char* dst, float* x, Py_ssize_t n, Py_ssize_t chunk,
                          Py_ssize_t k, int index_bits, int bits, uint32_t* scratch,
                          Py_ssize_t index_at, Py_ssize_t code_at, const float* src,
                          const float* err, float decay, Py_ssize_t first,
                          Py_ssize_t last) noexcept nogil:
    """Chunks ``first`` to ``last`` (excluded) of the part of ``x``; returns -1, or the first
    chunk whose largest magnitude is not finite (then ``dst`` holds unspecified bytes).
    ``first`` * k * bits and * index_bits must be whole bytes (the bits of other chunk ranges
    are not touched: ranges may be written at once). ``scratch``: 3 * chunk + 2 uint32s. With
    ``src`` (not NULL), each chunk of ``x`` is first made ``err * decay + src`` (``_feed``:
    one pass over memory for the error feedback and the selection)."""
    cdef const uint32_t* raw = <const uint32_t*>x
    cdef uint32_t* ck = scratch
    cdef uint32_t* ci = scratch + chunk + 1
    cdef uint32_t* tmp = scratch + 2 * chunk + 2
    cdef BitWriter wi, wc
    cdef Py_ssize_t j, i, base, m, kk, c, take_eq, g
    cdef uint32_t key, top, kth, est = 0, use
    cdef int64_t t
    cdef float s, v
    cdef double sd, half = ((1 << bits) - 1) / 2.0, levels = (1 << bits) - 1, q
    wi.p, wi.acc, wi.n = dst + index_at + first * k * index_bits // 8, 0, 0
    wc.p, wc.acc, wc.n = dst + code_at + first * k * bits // 8, 0, 0
    for j in range(first, last):
        base = j * chunk
        m = n - base if n - base < chunk else chunk
        kk = k if k < m else m
        # the last chunk's threshold, lowered, gives this one's candidates in the same pass
        # (the first chunk, a small one or after an estimate too high: from a sample)
        use = est if m >= 1024 and 8 * kk <= m else 0
        top = _feed_top(x + base, src + base if src != NULL else NULL,
                        err + base if src != NULL else NULL, decay, m, use, ck, ci, &c)
        if top >= 0x7F800000:
            return j
        if use == 0:
            c = _candidates(raw + base, m, kk, ck, ci, tmp, top)
        if c < kk:  # the estimate was too high: every key is a candidate
            for i in range(m):
                ck[i] = raw[base + i]
                ci[i] = <uint32_t>i
            c = m
        if 4 * c > m:  # many candidates: the radix select's cost is bounded
            take_eq = _threshold(ck, c, kk, &t)
        else:
            for i in range(c):
                tmp[i] = ck[i] & 0x7FFFFFFF
            kth = _kth_largest(tmp, c, kk)
            g = 0
            for i in range(c):
                g += (ck[i] & 0x7FFFFFFF) > kth
            t, take_eq = kth, kk - g
        est = _lowered(t) if c >= kk and c < m else 0
        memcpy(&s, &top, 4)
        memcpy(dst + 4 * j, &s, 4)
        sd = s
        for i in range(c):
            key = ck[i] & 0x7FFFFFFF
            if <int64_t>key < t or (<int64_t>key == t and take_eq == 0):
                continue
            if <int64_t>key == t:
                take_eq -= 1
            _put(&wi, <uint64_t>ci[i], index_bits)
            if sd == 0.0:
                _put(&wc, 0, bits)
                continue
            memcpy(&v, &ck[i], 4)  # (the value, kept with its key: not read again)
            q = (<double>v / sd + 1.0) * half
            q = (q + RINT_MAGIC) - RINT_MAGIC
            if q < 0.0:
                q = 0.0
            elif q > levels:
                q = levels
            _put(&wc, <uint64_t>q, bits)
    _flush(&wi)
    _flush(&wc)
    return -1


def sparse_compress(unsigned char[::1] dst, const unsigned char[::1] pending, Py_ssize_t chunk,
                    Py_ssize_t k, int index_bits, int bits, Py_ssize_t index_at,
                    Py_ssize_t code_at, unsigned char[::1] scratch,
                    const unsigned char[::1] src=None, const unsigned char[::1] err=None,
                    float decay=1.0, Py_ssize_t first=0, Py_ssize_t last=-1):
    """Write the part of ``pending`` (float32) into ``dst`` (``Layout.nbytes``);
    with ``src`` and ``err`` (float32, as long), first ``pending = err * decay + src``
    (``pending`` must then be writable: the front passes its own buffer).
    ``scratch`` holds 3 * ``chunk`` + 2 uint32s. ``first``, ``last``: only those chunks
    (``last`` -1: to the end; ``first`` a multiple of 8, so that calls on separate ranges,
    from separate threads, write separate bytes). ValueError if a chunk's largest magnitude
    is not finite."""
    cdef Py_ssize_t n = pending.shape[0] // 4, bad, chunks = (n + chunk - 1) // chunk
    cdef const float* s = NULL
    cdef const float* e = NULL
    if last < 0:
        last = chunks
    if n == 0 or chunk < 2 or k < 1 or scratch.shape[0] < 4 * (3 * chunk + 2) \
            or not 1 <= bits <= 16 or not 1 <= index_bits <= 16 or code_at > dst.shape[0] \
            or index_at > code_at or (src is None) != (err is None) \
            or not 0 <= first <= last <= chunks or first % 8:
        raise ValueError("sparse_compress: bad arguments")
    if src is not None:
        if src.shape[0] != pending.shape[0] or err.shape[0] != pending.shape[0]:
            raise ValueError("sparse_compress: bad arguments")
        s, e = <const float*>&src[0], <const float*>&err[0]
    with nogil:
        bad = _compress(&dst[0], <float*>&pending[0], n, chunk, k, index_bits, bits,
                        <uint32_t*>&scratch[0], index_at, code_at, s, e, decay, first, last)
    if bad >= 0:
        raise ValueError(f"a kept value of chunk {bad} is not finite")


cdef Py_ssize_t _accumulate(float* d, const unsigned char* part, Py_ssize_t n, Py_ssize_t chunk,
                            Py_ssize_t k, int index_bits, int bits, Py_ssize_t index_at,
                            Py_ssize_t code_at, int sign) noexcept nogil:
    """Add (``sign`` > 0) or subtract the decoded part into ``d``; returns -1, or the first
    chunk that lists an index outside itself (then ``d`` is partly updated)."""
    cdef float table[256]
    cdef BitReader ri, rc
    cdef Py_ssize_t j, t, base, m, kk, i
    cdef int levels = (1 << bits) - 1, c
    cdef double step = 2.0 / levels, sd
    cdef float s
    ri.p, ri.acc, ri.n = part + index_at, 0, 0
    rc.p, rc.acc, rc.n = part + code_at, 0, 0
    for j in range((n + chunk - 1) // chunk):
        base = j * chunk
        m = n - base if n - base < chunk else chunk
        kk = k if k < m else m
        memcpy(&s, part + 4 * j, 4)
        sd = s
        for c in range(levels + 1):
            table[c] = <float>(sd * (<double>c * step - 1.0))
        for t in range(kk):
            i = <Py_ssize_t>_get(&ri, index_bits)
            c = <int>_get(&rc, bits)
            if i >= m:
                return j
            if sign > 0:
                d[base + i] = d[base + i] + table[c]
            else:
                d[base + i] = d[base + i] - table[c]
    return -1


def sparse_accumulate(unsigned char[::1] dst, const unsigned char[::1] part, Py_ssize_t chunk,
                      Py_ssize_t k, int index_bits, int bits, Py_ssize_t index_at,
                      Py_ssize_t code_at, int sign):
    """Add (``sign`` 1) or subtract (-1) the decoded ``part`` into ``dst`` (float32).
    ValueError if the part lists an index outside its chunk."""
    cdef Py_ssize_t n = dst.shape[0] // 4, bad
    if n == 0 or chunk < 1 or k < 1 or not 1 <= bits <= 8 or not 1 <= index_bits <= 16 \
            or code_at > part.shape[0] or index_at > code_at or index_at < 4 * ((n + chunk - 1) // chunk):
        raise ValueError("sparse_accumulate: bad arguments")
    with nogil:
        bad = _accumulate(<float*>&dst[0], &part[0], n, chunk, k, index_bits, bits, index_at,
                          code_at, sign)
    if bad >= 0:
        raise ValueError(f"chunk {bad} of the part lists an index outside the chunk")
