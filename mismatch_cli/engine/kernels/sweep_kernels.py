"""The numba kernels' sources and signatures, compiled by engine/kernels/sweep.py (which is their Python face).

Plain Python over numpy arrays, in the subset numba compiles; this module imports neither numba nor torch.
Each kernel's inner loops are kept simple enough for LLVM to vectorize them (float64 sums of float32 terms,
reassociated, but for STRICT_ORDER's); float32 differences, products and comparisons are taken as numpy and torch
take them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mismatch_cli.engine.kernels.sketch import NUM_BUCKETS, SHIFT

SKETCH_SIZE = 2 * NUM_BUCKETS  # the diagnostics' signed sketch of delta: the top bits of its float32 pattern
OCTAVE_SHIFT, OCTAVES = 23, 512  # the signatures' signed octaves: sign and exponent of a float32 (signatures.py)
POSITION_BIN = 32  # positions per bin of the diagnostics' position profile (diagnostics.POSITION_BIN)
assert SKETCH_SIZE >> (OCTAVE_SHIFT - SHIFT) == OCTAVES  # an octave is a run of sketch buckets (_sweep counts so)


def _sweep_signature(types: Any) -> Any:
    vector = types.Array
    f32, i64, f64 = vector(types.float32, 1, "C"), vector(types.int64, 1, "C"), vector(types.float64, 1, "C")
    return types.void(f32, f32, f32, vector(types.uint32, 1, "C"), f32, f32, f32, f32, f32,
                      vector(types.boolean, 1, "C"), vector(types.boolean, 1, "C"), i64, f32, types.float32,
                      types.float32, types.float32, types.float32, i64, vector(types.float64, 2, "C"), i64, f64, i64,
                      f64)


def _segments_signature(types: Any) -> Any:
    f32 = types.Array(types.float32, 1, "C")
    return types.void(f32, f32, f32, types.float32, types.float32, types.Array(types.int64, 1, "C"), f32, f32, f32, f32,
                      types.Array(types.float64, 2, "C"))


def _segments(old, rollout, ratio, low, high, lengths, abs_out, safe_out, sq_out, k3_out, out) -> None:  # noqa: ANN001
    # The chunk's derived per-token tensors from old, rollout and torch's exp of their difference, each as torch
    # gives it in float32 (Chunk.abs_log_ratio, ratio_safe, ratio_safe_sq, k3; a NaN stays NaN through the clamp),
    # and their sums per segment, in token order (STRICT_ORDER).
    one = np.float32(1.0)
    start = 0
    for row in range(lengths.shape[0]):
        end = start + lengths[row]
        s_o = s_r = s_d = s_a = s_q = s_q2 = s_k = 0.0
        for t in range(start, end):
            o = old[t]
            r = rollout[t]
            d = o - r
            a = abs(d)
            e = ratio[t]
            q = low if e < low else e
            q = high if q > high else q
            q2 = q * q
            k = (e - d) - one
            abs_out[t] = a
            safe_out[t] = q
            sq_out[t] = q2
            k3_out[t] = k
            s_o += o
            s_r += r
            s_d += d
            s_a += a
            s_q += q
            s_q2 += q2
            s_k += k
        out[row, 0] = s_o
        out[row, 1] = s_r
        out[row, 2] = s_d
        out[row, 3] = s_a
        out[row, 4] = s_q
        out[row, 5] = s_q2
        out[row, 6] = s_k
        start = end


def _option_signature(types: Any) -> Any:
    vector = types.Array
    return types.void(vector(types.float32, 1, "C"), vector(types.int64, 1, "C"), types.float32, types.float32,
                      types.boolean, vector(types.boolean, 1, "C"), vector(types.float64, 1, "C"),
                      vector(types.int64, 1, "C"), vector(types.float64, 1, "C"))


def _option(stat, lengths, low, high, two_sided, reject, row_sums, row_rejects, sums) -> None:  # noqa: ANN001
    # A token-level RS option: the comparisons and the clamp are float32, as torch takes a float32 tensor against a
    # Python float.
    start = 0
    s = s_c = s_c2 = 0.0
    high_n = low_n = rejected = 0
    top = np.float32(-np.inf)
    bottom = np.float32(np.inf)
    for row in range(lengths.shape[0]):
        end = start + lengths[row]
        r_s = r_c = r_c2 = 0.0
        r_n = 0
        for t in range(start, end):
            x = stat[t]
            above = x > high
            below = x < low
            out = not ((x <= high) & ((not two_sided) | (x >= low)))  # as OptionBounds.keep: NaN is rejected
            reject[t] = out
            c = np.float64(min(max(x, low), high))
            r_s += x
            r_n += out
            r_c += c
            r_c2 += c * c
            high_n += above
            low_n += below
            top = max(top, x)
            bottom = min(bottom, x)
        row_sums[row] = r_s
        row_rejects[row] = r_n
        s += r_s  # float64 partials per row, then over rows (blocked)
        s_c += r_c
        s_c2 += r_c2
        rejected += r_n
        start = end
    values = (s, s_c, s_c2, float(high_n), float(low_n), float(rejected), np.float64(top), np.float64(bottom))
    for i in range(len(values)):
        sums[i] = values[i]


def _weights_signature(types: Any) -> Any:
    f32, f64 = types.Array(types.float32, 1, "C"), types.Array(types.float64, 1, "C")
    return types.void(f32, types.Array(types.int64, 1, "C"), types.float32, types.float32, types.float32,
                      types.boolean, f32, f64, f64)


def _weights(raw, lengths, upper, lower, metric_lower, icepop, weight, row_sums, sums) -> None:  # noqa: ANN001
    # Token-level IS: the applied weight (TIS: the raw ratio clamped at U; IcePop: zeroed outside [L, U]) and its
    # sums, in float32 comparisons as torch takes them against Python floats.
    start = 0
    s_w = s_w2 = 0.0
    high_n = low_n = oob_n = 0
    top = np.float32(-np.inf)
    bottom = np.float32(np.inf)
    zero = np.float32(0.0)
    for row in range(lengths.shape[0]):
        end = start + lengths[row]
        r_w = r_w2 = 0.0
        for t in range(start, end):
            x = raw[t]
            above = x > upper
            below = x < lower
            if icepop:  # as torch.where(kept, raw, 0) and raw.clamp(max=U): a NaN is zeroed, or kept
                w = x if (x >= lower) & (x <= upper) else zero
            else:
                w = upper if above else x
            weight[t] = w
            w64 = np.float64(w)
            r_w += w64
            r_w2 += w64 * w64
            high_n += above
            low_n += x < metric_lower
            oob_n += below | above
            top = max(top, w)
            bottom = min(bottom, w)
        row_sums[row] = r_w
        s_w += r_w  # float64 partials per row, then over rows: blocked, so the error does not grow with the chunk
        s_w2 += r_w2
        start = end
    values = (s_w, s_w2, float(high_n), float(low_n), float(oob_n), np.float64(top), np.float64(bottom))
    for i in range(len(values)):
        sums[i] = values[i]


def _round_sketches_signature(types: Any) -> Any:
    i64, counts = types.Array(types.int64, 1, "C"), types.Array(types.int64, 2, "C")
    return types.void(types.Array(types.int32, 1, "C"), i64, i64, i64, types.int32, counts, counts, i64)


def _round_sketches(bits, run_tokens, run_index, run_index_from_end, over_bits, from_start, from_end,  # noqa: ANN001
                    over) -> None:
    # The rounds' sketches of |delta| from either end of the row: the bucket is the top bits of the float32
    # pattern (sketch.LogSketch.buckets); runs are contiguous in the valid tokens, in order. `over` counts each
    # run's tokens above the float32 whose pattern is `over_bits` (patterns order as values: |delta| >= 0).
    t = 0
    for run in range(run_tokens.shape[0]):
        first = run_index[run]
        last = run_index_from_end[run]
        above = 0
        for _ in range(run_tokens[run]):
            b = bits[t]
            bucket = b >> SHIFT
            from_start[first, bucket] += 1
            from_end[last, bucket] += 1
            above += b > over_bits
            t += 1
        over[run] = above


def _sweep(old, rollout, log_ratio, bits, ratio, ratio_sq, exp_abs, exp_old, exp_rollout, continues, keep,  # noqa: ANN001, PLR0913, PLR0915
           offsets, abs_log_ratio, fill, below, scale, top, sketch, octaves, slopes, position_sums,
           position_tokens, sums) -> None:
    # Three loops: the token sums (branch-free, so that LLVM vectorizes them: float64 sums of float32 terms,
    # reassociated), the histograms in token order, the position profile over positions. Token t is the t-th
    # valid position; continues[t]: token t - 1 is in t's row (the pair the fills and shift residuals read).
    n = old.shape[0]
    s_exp = 0.0
    s_x = s_p = s_xx = s_xp = s_pp = s_abs_p = 0.0
    oo = rr = o_r = 0.0
    negative = equal = zero_o_n = zero_r_n = 0
    max_abs_p = 0.0
    for t in range(n):
        o = old[t]
        r = rollout[t]
        negative += log_ratio[t] < 0
        s_exp += exp_abs[t]
        x = exp_old[t]
        p = x - exp_rollout[t]
        s_x += x
        s_p += p
        s_xx += x * x
        s_xp += x * p
        s_pp += p * p
        s_abs_p += abs(p)
        equal += o == r
        zero_o_n += (o == 0) & (r != 0)
        zero_r_n += (r == 0) & (o != 0)
        oo += o * o
        rr += r * r
        o_r += o * r
    rep_o_n = rep_r_n = fill_o_n = fill_r_n = 0
    aligned = forward = backward = 0.0
    if n:  # token 0 starts its row: a zero fill at most
        far = abs(log_ratio[0]) > fill
        fill_o_n += (old[0] == 0) & (rollout[0] != 0) & far
        fill_r_n += (rollout[0] == 0) & (old[0] != 0) & far
    for t in range(1, n):
        o = old[t]
        r = rollout[t]
        po = old[t - 1]
        pr = rollout[t - 1]
        pair = continues[t]
        rep_o = pair & (o == po)
        rep_r = pair & (r == pr)
        fill_o = rep_o & ~rep_r
        fill_r = rep_r & ~rep_o
        far = abs(log_ratio[t]) > fill
        rep_o_n += fill_o
        rep_r_n += fill_r
        fill_o_n += (((o == 0) & (r != 0)) | fill_o) & far
        fill_r_n += (((r == 0) & (o != 0)) | fill_r) & far
        e = log_ratio[t - 1]
        aligned += e * e if pair else 0.0
        e = po - r
        forward += e * e if pair else 0.0
        e = o - pr
        backward += e * e if pair else 0.0
    tail = np.empty(n, dtype=np.int64)  # the tail's tokens, listed without a branch: their slopes come after
    tails = 0
    # An octave's three sums side by side (one 32-byte store a token, not three apart); its token count is its
    # sketch buckets' (the octave is the bucket's top 9 bits), summed after the loop.
    by_octave = np.zeros((OCTAVES, 4), dtype=np.float64)
    for t in range(n):
        b = bits[t]
        sketch[(b >> SHIFT) & (SKETCH_SIZE - 1)] += 1
        k = b >> OCTAVE_SHIFT
        by_octave[k, 1] += ratio_sq[t]
        by_octave[k, 2] += ratio[t]
        by_octave[k, 3] += exp_abs[t]
        max_abs_p = max(max_abs_p, abs(exp_old[t] - exp_rollout[t]))  # here: a max would stop the vectorizing
        tail[tails] = t
        tails += old[t] < below
    per_octave = SKETCH_SIZE // OCTAVES
    for k in range(OCTAVES):
        count = 0
        for bucket in range(k * per_octave, (k + 1) * per_octave):
            count += sketch[bucket]
        octaves[0, k] += count
        for j in range(1, 4):
            octaves[j, k] += by_octave[k, j]
    for i in range(tails):  # a division per tail token only (most tokens are off the tail)
        t = tail[i]
        slopes[int(min(max(rollout[t] / old[t] * scale, np.float32(0.0)), top))] += 1
    t = 0
    for row in range(offsets.shape[0] - 1):
        begin = offsets[row]
        for piece in range(begin, offsets[row + 1], POSITION_BIN):
            piece_sum = 0.0
            piece_tokens = 0
            for position in range(piece, min(piece + POSITION_BIN, offsets[row + 1])):
                if keep[position]:
                    piece_sum += abs_log_ratio[t]
                    piece_tokens += 1
                    t += 1
            at = (piece - begin) // POSITION_BIN
            position_sums[at] += piece_sum
            position_tokens[at] += piece_tokens
    values = (float(negative), s_exp, s_x, s_p, s_xx, s_xp, s_pp, s_abs_p, max_abs_p, float(equal),
              float(zero_o_n), float(rep_o_n), float(fill_o_n), float(zero_r_n), float(rep_r_n), float(fill_r_n),
              oo, rr, o_r, aligned, forward, backward)
    for i in range(len(values)):
        sums[i] = values[i]


def _layout_signature(types: Any) -> Any:
    vector = types.Array
    f32, i64, flags = vector(types.float32, 1, "C"), vector(types.int64, 1, "C"), vector(types.boolean, 1, "C")
    return types.void(f32, f32, flags, i64, types.float32, flags, flags, i64, i64, i64, i64, i64, i64, f32, f32, i64)


def _layout(old, rollout, mask, offsets, sentinel, keep, starts, lengths, rounds, run_start, run_row,  # noqa: ANN001, PLR0913
            run_index, run_tokens, old_out, rollout_out, counts) -> None:
    # make_chunk's data-quality flags (quality.quality_flags), the rows' valid tokens, the rounds
    # (segments.Layout: runs of 1s in a row's mask) and the compaction of the valid tokens, as four simple loops
    # over the positions (the first two vectorize; the compaction stores without a branch), which measured
    # twice as fast as one loop with branches. Comparisons are float32 against float32, as numpy's; x - x == 0
    # is False for an infinity and a NaN alone.
    n = mask.shape[0]
    masked = nonfinite = sentinels = positive = one_side_zero = 0
    for p in range(n):
        m = mask[p]
        o = old[p]
        r = rollout[p]
        finite = (o - o == 0) & (r - r == 0)
        fill = (o <= sentinel) | (r <= sentinel)
        kept = m & finite & ~fill
        keep[p] = kept
        masked += m
        nonfinite += m & ~finite
        sentinels += m & finite & fill
        positive += kept & ((o > 0) | (r > 0))
        one_side_zero += kept & ((o == 0) != (r == 0))
    for p in range(1, n):  # a run starts after a 0 (a row's first position is set below)
        starts[p] = mask[p] & ~mask[p - 1]
    valid = 0
    for p in range(n):
        old_out[valid] = old[p]
        rollout_out[valid] = rollout[p]
        valid += keep[p]
    runs = most = valid = 0
    for row in range(offsets.shape[0] - 1):
        begin = offsets[row]
        end = offsets[row + 1]
        if begin < end:
            starts[begin] = mask[begin]  # a row's first position starts a run whatever precedes it
        first_valid = valid
        first_run = runs
        for p in range(begin, end):
            if starts[p]:
                run_start[runs] = p
                run_row[runs] = row
                run_index[runs] = runs - first_run
                run_tokens[runs] = valid  # the valid tokens before it, made a count below
                runs += 1
            valid += keep[p]
        lengths[row] = valid - first_valid
        rounds[row] = runs - first_run
        most = max(most, runs - first_run)
    for k in range(runs - 1):  # between a run's end and the next start every position is masked out
        run_tokens[k] = run_tokens[k + 1] - run_tokens[k]
    if runs:
        run_tokens[runs - 1] = valid - run_tokens[runs - 1]
    values = (valid, runs, most, masked, nonfinite, sentinels, positive, one_side_zero)  # sweep.LAYOUT_COUNTS' order
    for i in range(len(values)):
        counts[i] = values[i]


def _candidates_signature(types: Any) -> Any:
    f32 = types.Array(types.float32, 1, "C")
    return types.int64(f32, f32, types.float32, types.Array(types.int64, 1, "C"), types.Array(types.float64, 1, "C"))


def _candidates(abs_log_ratio, ratio, bound, index, rest) -> int:  # noqa: ANN001
    # The what-if ladder's candidate tokens (|delta| above `bound`, float32 against float32 as torch's gt) and the
    # float64 sums of the other tokens' safe ratios and of their float32 squares: a vectorized loop for the
    # sums, then the compaction's branch-free stores. Returns how many candidates.
    zero = np.float32(0.0)
    s = s2 = 0.0
    for t in range(abs_log_ratio.shape[0]):
        w = zero if abs_log_ratio[t] > bound else ratio[t]
        s += w
        s2 += w * w
    k = 0
    for t in range(abs_log_ratio.shape[0]):
        index[k] = t
        k += abs_log_ratio[t] > bound
    rest[0] = s
    rest[1] = s2
    return k


# Kernels compiled without reassociation: with it, the first call of the segment sums in a process summed some
# rows in another order than every later call on the same inputs (one ulp in log_ppl_diff between --jobs 1 and
# --jobs 2, 2026-11-28). Their float64 sums run in token order.
STRICT_ORDER = frozenset({"segments"})

# name -> (kernel, its numba signature from numba.types)
KERNELS = {"sweep": (_sweep, _sweep_signature), "segments": (_segments, _segments_signature),
           "option": (_option, _option_signature), "weights": (_weights, _weights_signature),
           "round_sketches": (_round_sketches, _round_sketches_signature), "layout": (_layout, _layout_signature),
           "candidates": (_candidates, _candidates_signature)}
