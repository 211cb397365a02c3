"""TRITON_INTERPRET=1 PYTHONPATH=. /tmp/tri/bin/python tests/gpu/triton_interpreter_check.py

Runs genolc's Triton kernels (mHC's merge, forward and backward; the DSA pool mass, the indexer loss's target; KDA's
short convolution, forward and backward; the routed experts' glue; mHC mixing logits and mixing matrix; indexer
scoring and top-k, and the scoring kernel that also writes the top-k's first read; DSA latent sparse attention
forward, lse and backward; the slab order of the DSA backward's index rows and its row dot; the hyper-connection's
block input; the sparse indexer KL's pair; the groups ``merge``, ``pool_mass``, ``slab_order``, ``row_dot``,
``conv``, ``moe``, ``mhc``, ``block_input``, ``comb``, ``indexer_kl``, ``top_pools``, ``score_tops``,
``indexer_score_tops``, ``indexer``, ``dsa``, given as arguments, run alone) on CPU tensors under Triton's
interpreter and compares them with the pure-torch references at small odd shapes: T = 37, 77, 101, 203, kpool 1/4/16,
batch 2, head counts and latent ranks that are not powers of two (and a head count that needs two head blocks), index
rows with -1 slots and wholly empty rows, int32 and int64 indices, strided index rows. Exit status 0 when everything
matches.

Not part of the CI suite (pytest collects ``test_*.py`` only): it needs Triton, which genolc does not depend on on
CPU. Use a throwaway venv, never the project's:

    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install torch==2.13.0 triton numpy safetensors click

The interpreter runs the kernels' Python semantics (masks, offsets, online softmax, atomics) but says nothing about
registers, shared memory or speed; those need the GPU tests beside this file. The indexer runs in fp32 only here:
Triton 3.9's interpreter gets ``tl.dot`` of bf16 tiles wrong (errors ~1e10 on a plain 16x16 product, while
bf16 loads and fp32 dots are exact), so a bf16 indexer case would test the interpreter, not the kernel. The DSA
kernels are tl.dot kernels too and are checked in fp32 only (IEEE dots); bf16 is the GPU tests' job.
"""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (see the command in this file's docstring)")

import torch  # noqa: E402

from genolc.model.ops.dsa import triton as dsa_triton  # noqa: E402
from genolc.model.ops.dsa import reference as dsa_reference  # noqa: E402
from genolc.model.ops.dsa import row_dot as dsa_row_dot  # noqa: E402
from genolc.model.ops.indexer import triton as indexer_triton  # noqa: E402
from genolc.model.ops.indexer import layout as indexer_layout  # noqa: E402
from genolc.model.ops.indexer import reference as indexer_reference  # noqa: E402
from genolc.model.ops.indexer_kl import reference as indexer_kl_reference  # noqa: E402
from genolc.model.ops.indexer_kl import triton as indexer_kl_triton  # noqa: E402
from genolc.model.ops.mhc import comb_triton  # noqa: E402
from genolc.model.ops.mhc import merge_triton  # noqa: E402
from genolc.model.ops.mhc import op as mhc_op  # noqa: E402
from genolc.model.ops.mhc import reference as mhc_reference  # noqa: E402
from genolc.model.ops.mhc import triton as mhc_triton  # noqa: E402
from genolc.model.ops.moe import op as moe_op  # noqa: E402
from genolc.model.ops.moe import triton as moe_triton  # noqa: E402
from genolc.model.ops.indexer.triton_topk import TopPoolsBuffers, launch_shape, top_pools  # noqa: E402
from genolc.model.ops.kda import conv as kda_conv  # noqa: E402
from genolc.model.ops.kda import conv_triton as kda_conv_triton  # noqa: E402
from slab_order_check import slab_order_problems  # noqa: E402
from top_pools_check import overflow_problems, score_blocks, score_tops_problems, top_pools_problems  # noqa: E402,E501


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def selected_scores(index_q, weights, pooled, rows, topk, kpool, scale) -> torch.Tensor:
    """Reference fp32 scores of each row's selected pools, sorted descending (-inf for empty slots)."""
    pools = indexer_layout.selected_pools(rows, topk, kpool)
    gathered = pooled[torch.arange(pooled.shape[0])[:, None, None], pools.clamp_min(0)]
    scores = indexer_reference.pool_scores(index_q, weights, gathered, scale)
    return scores.masked_fill(pools < 0, float("-inf")).sort(-1, descending=True).values


def check_indexer(batch, length, heads, dim, topk, kpool, tail, dtype, query_chunk, out_dtype,
                  offset=0) -> list[str]:
    """``offset``: the queries are the window's last ``length - offset`` positions, as one chunk of a window is."""
    gen = torch.Generator().manual_seed(length * 31 + kpool)
    index_q = torch.randn(batch, length, heads, dim, generator=gen).to(dtype)
    weights = torch.randn(batch, length, heads, generator=gen) * heads ** -0.5
    pooled = torch.randn(batch, length // kpool, dim, generator=gen).to(dtype)
    kwargs = dict(kpool=kpool, topk=topk, select_tail=tail, softmax_scale=dim ** -0.5)
    expected = indexer_reference.select_indices(index_q, weights, pooled, **kwargs)
    got = indexer_triton.streamed_select(index_q[:, offset:], weights[:, offset:], pooled, query_chunk=query_chunk,
                                       out_dtype=out_dtype, query_offset=offset, **kwargs)
    if offset:
        got = torch.cat([expected[:, :offset].to(out_dtype), got], dim=1)
    problems = []
    if got.shape != expected.shape or got.dtype != out_dtype:
        return [f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(expected.shape)} {out_dtype}"]
    # A kept selection (genolc/model/cache.py) is these rows' pools, expanded again when the chunk runs a second time.
    kept = indexer_layout.selected_pools(got, topk, kpool)
    if not torch.equal(indexer_layout.index_rows(kept, query_offset=0, kpool=kpool, select_tail=tail,
                                                 dtype=out_dtype), got):
        problems.append("the rows' pools do not expand back to the rows")
    got = got.long()
    if not torch.equal(got[..., topk:], expected[..., topk:]):
        problems.append("tail slots differ")
    if not torch.equal((got < 0).sum(-1), (expected < 0).sum(-1)):
        problems.append("empty-slot counts differ")
    if not bool((got <= torch.arange(length)[None, :, None]).all()):
        problems.append("non-causal index")
    slots = got[..., :topk].view(batch, length, topk // kpool, kpool)
    if not bool(((slots[..., 1:] - slots[..., :1] == torch.arange(1, kpool)) | (slots[..., 1:] < 0)).all()):
        problems.append("a slot does not hold kpool consecutive tokens")
    # Sets may differ only between pools whose scores tie (ReLU zeros tie often at few heads).
    mine = selected_scores(index_q.float(), weights, pooled.float(), got, topk, kpool, dim ** -0.5)
    theirs = selected_scores(index_q.float(), weights, pooled.float(), expected, topk, kpool, dim ** -0.5)
    finite = torch.isfinite(theirs)
    if not torch.equal(finite, torch.isfinite(mine)):
        problems.append("different number of selected pools")
    elif not torch.allclose(mine[finite], theirs[finite], rtol=1e-5 if dtype == torch.float32 else 2e-2,
                            atol=1e-5 if dtype == torch.float32 else 2e-2):
        problems.append(f"selected scores differ (max {float((mine[finite] - theirs[finite]).abs().max()):.3g})")
    identical = (got[..., :topk].sort(-1).values == expected[..., :topk].sort(-1).values).all(-1)
    print(f"    identical rows {float(identical.float().mean()):.3f}")
    return problems


def index_rows(batch, length, topk, kpool, seed) -> torch.Tensor:
    """Indexer-layout rows from the reference selection, then -1 holes and two wholly empty rows."""
    gen = torch.Generator().manual_seed(seed)
    index_q = torch.randn(batch, length, 2, 16, generator=gen)
    weights = torch.rand(batch, length, 2, generator=gen)
    pooled = torch.randn(batch, length // kpool, 16, generator=gen)
    rows = indexer_reference.select_indices(index_q, weights, pooled, kpool=kpool, topk=topk, select_tail=True,
                                            softmax_scale=0.2)
    holes = torch.rand(rows.shape, generator=gen) < 0.15
    rows = rows.masked_fill(holes, -1)
    rows[0, length // 2] = -1
    rows[batch - 1, length - 1] = -1
    return rows


def check_dsa(batch, length, heads, rank, topk, kpool, index_dtype, strided_indices=False) -> list[str]:
    """The latent (absorbed-MLA) kernels, fp32 (the interpreter's bf16 tl.dot is wrong), against the reference."""
    indices = index_rows(batch, length, topk, kpool, seed=length + kpool).to(index_dtype)
    if strided_indices:
        # Rows with a row stride wider than W, as a slice of a wider buffer gives.
        wide = torch.full((batch, length, indices.shape[-1] + 5), -7, dtype=index_dtype)
        wide[..., : indices.shape[-1]] = indices
        indices = wide[..., : indices.shape[-1]]
    gen = torch.Generator().manual_seed(7 * length + heads)
    q_lat = torch.randn(batch, length, heads, rank, generator=gen)
    latent = torch.randn(batch, length, rank, generator=gen)
    d_out = torch.randn(batch, length, heads, rank, generator=gen)
    scale = 0.7 * rank ** -0.5
    results = []
    for op in (dsa_reference.sparse_latent_attention, dsa_triton.sparse_latent_attention_forward, None):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q_lat, latent)]
        if op is None:
            prepared = dsa_triton.prepare_inputs(*leaves, indices)
            dsa_triton.check_kernel_inputs(*prepared)
            out = dsa_triton.SparseLatentAttention.apply(*prepared, scale)
        elif op is dsa_triton.sparse_latent_attention_forward:
            with torch.no_grad():
                out, lse = op(q_lat, latent, indices.contiguous(), scale)
            results.append((out, lse))
            continue
        else:
            out = op(*leaves, indices, scale, query_chunk=17)
        results.append((out, torch.autograd.grad((out * d_out).sum(), leaves)))
    (ref_out, ref_grads), (fwd_out, lse), (out, grads) = results
    problems = []
    if out.shape != ref_out.shape or out.dtype != torch.float32:
        return [f"shape/dtype {tuple(out.shape)} {out.dtype} vs {tuple(ref_out.shape)}"]
    for name, mine in (("out", out), ("forward-only out", fwd_out)):
        if rel_err(mine, ref_out) > 1e-5:
            problems.append(f"{name} rel err {rel_err(mine, ref_out):.2e}")
    empty = (indices < 0).all(-1)
    if not empty.any():
        problems.append("case has no empty row")
    if out[empty].abs().max() != 0:
        problems.append("an empty row is not zero")
    # lse: natural-log log-sum-exp of the scaled scores over valid slots, +inf for empty rows.
    safe = indices.long().clamp_min(0)
    gathered = latent[torch.arange(batch)[:, None, None], safe]
    scores = torch.einsum("bthr,btwr->bthw", q_lat.double(), gathered.double()) * scale
    expected_lse = scores.masked_fill((indices < 0)[:, :, None, :], float("-inf")).logsumexp(-1)
    expected_lse = expected_lse.masked_fill(empty[..., None], float("inf"))
    if not torch.equal(torch.isinf(lse), torch.isinf(expected_lse)) or not torch.allclose(
            lse[~empty], expected_lse[~empty].float(), rtol=1e-5, atol=1e-5):
        problems.append("lse differs")
    for name, mine, theirs in zip(("q_lat", "latent"), grads, ref_grads):
        if mine.dtype != torch.float32 or rel_err(mine, theirs) > 1e-5:
            problems.append(f"d{name} rel err {rel_err(mine, theirs):.2e}")
    return problems


def check_pool_mass(batch, length, heads, rank, topk, kpool, index_dtype) -> list[str]:
    """The indexer loss's target, attention mass per selected pool: the Triton kernel and the reference (fp32)
    against the formula in float64, on rows with holes and empty rows."""
    indices = index_rows(batch, length, topk, kpool, seed=length + 3 * kpool).to(index_dtype)
    gen = torch.Generator().manual_seed(11 * length + heads)
    q_lat = torch.randn(batch, length, heads, rank, generator=gen)
    latent = torch.randn(batch, length, rank, generator=gen)
    scale = 0.7 * rank ** -0.5
    gathered = latent[torch.arange(batch)[:, None, None], indices.long().clamp_min(0)].double()
    scores = torch.einsum("bthr,btwr->bthw", q_lat.double(), gathered) * scale
    scores = scores.masked_fill((indices < 0)[:, :, None, :], float("-inf"))
    lse = scores.logsumexp(-1)
    probs = (scores - lse[..., None]).exp().nan_to_num(0.0)
    expected = probs.sum(2)[..., :topk].reshape(batch, length, topk // kpool, kpool).sum(-1)
    # The attention forward's form of the log-sum-exp: fp32, +inf for a row with no slot.
    forward_lse = lse.float().masked_fill(lse == float("-inf"), float("inf"))
    problems = []
    for name, got in (("triton", dsa_triton.sparse_pool_mass(q_lat, latent, indices.contiguous(), scale,
                                                             kpool=kpool, topk=topk)),
                      ("triton given lse", dsa_triton.sparse_pool_mass(q_lat, latent, indices.contiguous(), scale,
                                                                       kpool=kpool, topk=topk, lse=forward_lse)),
                      # A normaliser one lower is read as given: every probability e times the formula's.
                      ("triton given lse - 1", dsa_triton.sparse_pool_mass(
                          q_lat, latent, indices.contiguous(), scale, kpool=kpool, topk=topk,
                          lse=forward_lse - 1.0) / torch.e),
                      ("reference", dsa_reference.sparse_pool_mass(q_lat, latent, indices, scale, kpool=kpool,
                                                                   topk=topk, query_chunk=13))):
        if got.shape != expected.shape or got.dtype != torch.float32:
            problems.append(f"{name}: {tuple(got.shape)} {got.dtype} vs {tuple(expected.shape)}")
        elif rel_err(got, expected) > 1e-5 or (got - expected).abs().max() > 1e-5:
            problems.append(f"{name}: rel err {rel_err(got, expected):.2e}")
    return problems


def check_indexer_kl(batch, rows, heads, dim, n_pools, slots, kpool, empty, q_dtype, index_dtype, strided,
                     offset) -> list[str]:
    """The sparse indexer KL per row (genolc/model/ops/indexer_kl/triton.py, forward and backward) against the
    formula in fp64 with autograd: the KL, which rows have a pool, and the gradients of the queries, head weights and
    pool keys. Rows with empty slots, a row with none, pools chosen twice in a row, a row whose target mass is all
    zero, index rows whose pool slots are read as entry ``j * kpool`` (a tail after them), ``strided`` operands
    (queries, weights, target and index rows sliced out of wider tensors, each with its own strides), ``offset``
    added to every score (the last head's dot is the same for every pool: a large common score checks the
    log-sum-exp kept as max and log-sum apart; the kernels must then be within 4 times the fp32 formula's own error
    against fp64), and a NaN query (that row's KL NaN, the others' finite, as in the reference)."""
    gen = torch.Generator().manual_seed(rows * 7 + heads * dim)
    wide = 2 if strided else 1
    index_q = torch.randn(batch, rows, wide * heads, dim, generator=gen)[:, :, ::wide].to(q_dtype)
    head_weights = torch.rand(batch, rows, heads, wide + 1, generator=gen)[..., 1] + 0.5
    pooled = torch.randn(batch, n_pools, dim, generator=gen)
    if offset:
        index_q[:, :, -1] = 0.0
        index_q[:, :, -1, 0] = 1.0
        head_weights[:, :, -1] = 1.0
        pooled[..., 0] = offset / 0.3
    pools = torch.randint(0, n_pools, (batch, rows, slots), generator=gen)
    pools = pools.masked_fill(torch.rand(batch, rows, slots, generator=gen) < empty, -1)
    pools[0, rows // 2] = -1
    tokens = (pools[..., None] * kpool + torch.arange(kpool)).masked_fill(pools[..., None] < 0, -1).flatten(-2)
    indices = torch.cat([tokens, torch.full((batch, rows, kpool - 1 + 5 * wide), 3)], dim=-1).to(index_dtype)
    indices = indices[..., : slots * kpool + kpool - 1]
    pool_mass = torch.rand(batch, rows, slots + 3 * wide, generator=gen)[..., :slots]
    pool_mass[0, rows - 1] = 0.0
    upstream = torch.randn(batch, rows, generator=gen)
    leaves = [t.requires_grad_() for t in (index_q, head_weights, pooled)]
    shape = {"kpool": kpool, "topk": slots * kpool}
    kl, has_pool = indexer_kl_triton.sparse_kl_rows(pool_mass, *leaves, indices, 0.3, **shape)
    grads = torch.autograd.grad((kl * upstream).sum(), leaves)
    exact_leaves = [t.detach().double().requires_grad_() for t in leaves]
    q64, w64, pooled64 = exact_leaves
    chosen = pooled64[torch.arange(batch)[:, None, None], pools.clamp_min(0)]
    scores = (w64[..., None] * torch.relu(0.3 * torch.einsum("bchd,bcpd->bchp", q64, chosen))).sum(2)
    exact_kl, exact_has = indexer_kl_reference.kl_rows(pool_mass.double(), scores, pools >= 0)
    exact = torch.autograd.grad((exact_kl * upstream.double()).sum(), exact_leaves)
    fp32_leaves = [t.detach().float().requires_grad_() for t in leaves]
    fp32_kl, _ = indexer_kl_reference.sparse_kl_rows(pool_mass, *fp32_leaves, indices, 0.3, **shape)
    fp32 = torch.autograd.grad((fp32_kl * upstream).sum(), fp32_leaves)
    problems = []
    if kl.dtype != torch.float32 or rel_err(kl, exact_kl) > max(1e-5, 4 * rel_err(fp32_kl, exact_kl)) \
            or not torch.equal(has_pool, exact_has):
        problems.append(f"kl rel err {rel_err(kl, exact_kl):.2e} ({kl.dtype}), rows with a pool "
                        f"{'equal' if torch.equal(has_pool, exact_has) else 'differ'}")
    if kl[0, rows // 2] != 0 or has_pool[0, rows // 2]:
        problems.append("the row without a pool has a KL or a pool")
    for name, got, leaf, truth, formula in zip(("index_q", "head_weights", "pooled"), grads, leaves, exact, fp32):
        # A bf16 gradient is rounded once; the interpreter truncates (check_mhc's note), twice the rounding's error.
        limit = max(8e-3 if got.dtype == torch.bfloat16 else 1e-5, 4 * rel_err(formula, truth))
        if got.dtype != leaf.dtype or got.shape != leaf.shape or rel_err(got, truth) > limit:
            problems.append(f"d{name} rel err {rel_err(got, truth):.2e} ({got.dtype}; the fp32 formula's "
                            f"{rel_err(formula, truth):.2e})")
    poisoned = index_q.detach().clone()
    poisoned[0, 1, 0, 0] = float("nan")
    nan_kl, nan_has = indexer_kl_triton.sparse_kl_rows(pool_mass, poisoned, head_weights.detach(), pooled.detach(),
                                                       indices, 0.3, **shape)
    if rows > 2 and not (nan_kl[0, 1].isnan() and nan_has[0, 1] and nan_kl[0, 2:].isfinite().all()):
        problems.append(f"a NaN query gave KL {float(nan_kl[0, 1])} (pool: {bool(nan_has[0, 1])}), the other rows "
                        f"{'finite' if nan_kl[0, 2:].isfinite().all() else 'not finite'}")
    return problems


def check_slab_order(batch, length, width, kv_len, slab_rows, order, index_dtype, strided=False) -> list[str]:
    """The slab order's kernel, into poisoned buffers, against the torch form: the same rows and offsets exactly."""
    return slab_order_problems(batch, length, width, kv_len, slab_rows, order, index_dtype, strided, device="cpu")


def check_row_dot(batch, length, heads, rank, dtype) -> list[str]:
    """The slab backward's row dot, rowsum(O * dO) in fp32: the kernel against float64 and the torch form."""
    gen = torch.Generator().manual_seed(length + rank)
    out, d_out = (torch.randn(batch, length, heads, rank, generator=gen).to(dtype) for _ in range(2))
    expected = (out.double() * d_out.double()).sum(-1)
    got = dsa_row_dot.row_dot_triton(out, d_out)
    if got.shape != expected.shape or got.dtype != torch.float32:
        return [f"{tuple(got.shape)} {got.dtype} vs {tuple(expected.shape)}"]
    torch_error = (dsa_row_dot.row_dot_reference(out, d_out).double() - expected).abs().max()
    error = (got.double() - expected).abs().max()
    return [] if error <= max(2 * torch_error, 1e-6) else [f"max error {error:.2e}, the torch form's {torch_error:.2e}"]


def check_merge(lead, n, dim, dtype, rows_per_program, block_d, transposed=False) -> list[str]:
    """mHC's merge and its backward: the kernels against the reference formulas in float64; ``dtype`` is the streams'
    and the block output's (post and comb fp32), so bf16 results are within their rounding. ``transposed``: every
    input a transposed view (the wrappers copy them)."""
    gen = torch.Generator().manual_seed(7 * dim + n)
    streams = torch.randn(*lead, n, dim, generator=gen).to(dtype)
    block_out = torch.randn(*lead, dim, generator=gen).to(dtype)
    if transposed:
        streams = streams.transpose(0, 1).contiguous().transpose(0, 1)
        block_out = block_out.transpose(0, 1).contiguous().transpose(0, 1)
    post = 2 * torch.rand(*lead, n, generator=gen)
    comb = torch.softmax(torch.randn(*lead, n, n, generator=gen), -1)
    grad = torch.randn(*lead, n, dim, generator=gen).to(dtype)
    inputs = (block_out, post, comb, streams)
    exact = [t.double() for t in inputs]
    # bf16: one rounding of the result is 1.6e-3; the interpreter's bf16 stores round about twice as far.
    tolerance = 1e-6 if dtype == torch.float32 else 5e-3
    config = dict(rows_per_program=rows_per_program, block_d=block_d, num_warps=4)
    pairs = {"merge": (merge_triton.merge(*inputs, **config), mhc_reference.merge(*exact))}
    got = merge_triton.merge_backward(grad, *inputs, **config)
    expected = mhc_reference.merge_backward(grad.double(), *exact)
    for name, g, e in zip(("d block_out", "d post", "d comb", "d streams"), got, expected):
        pairs[name] = (g, e)
    problems = []
    for (name, (g, e)), source in zip(pairs.items(), (streams,) + inputs):
        if not g.numel():
            if g.shape != e.shape or (name in ("d post", "d comb") and g.abs().sum() != 0):
                problems.append(f"{name}: empty case {tuple(g.shape)}")
            continue
        if g.shape != e.shape or g.dtype != source.dtype:
            problems.append(f"{name}: {tuple(g.shape)} {g.dtype}, expected {tuple(e.shape)} {source.dtype}")
        elif rel_err(g, e) > tolerance:
            problems.append(f"{name}: rel err {rel_err(g, e):.2e}")
    return problems


def check_top_pools(rows, cols, first_query, kpool, keep) -> list[str]:
    """The top-k kernel on each kind of score block of top_pools_check.py, int32 and int64 output, at the default
    launch and the two the device has yet to time (the second read loading ahead, 512-score blocks)."""
    problems = []
    for launch in ({}, {"prefetch": True}, {"block": 512}, {"block": 512, "prefetch": True}):
        shape = launch_shape(keep, **launch)
        buffers = TopPoolsBuffers.allocate(rows, cols, keep, torch.device("cpu"), shape)
        for name, scores in score_blocks(rows, cols, keep, seed=cols, device="cpu").items():
            for dtype in (torch.int32, torch.int64):
                out = torch.empty(rows, keep, dtype=dtype)
                top_pools(scores, first_query=first_query, kpool=kpool, keep=keep, out=out, buffers=buffers,
                          shape=shape)
                where = f"{name} {dtype} {launch or 'default'}"
                problems += [f"{where}: {p}" for p in top_pools_problems(scores, out, first_query=first_query,
                                                                         kpool=kpool, keep=keep)]
                problems += [f"{where}: {p}" for p in overflow_problems(name, scores, buffers,
                                                                        first_query=first_query, kpool=kpool,
                                                                        keep=keep)]
    return problems


def check_score_tops(rows, n_pools, first_query, keep, heads, dim) -> list[str]:
    """top_pools_check.score_tops_problems on CPU tensors: fp32 inputs (the interpreter's dots take no bf16)."""
    return score_tops_problems(rows, n_pools, first_query, keep, heads, dim, dtype=torch.float32, device="cpu")


def check_indexer_score_tops(*case) -> list[str]:
    """check_indexer with streamed_select scoring through the kernel that writes the top-k's first read."""
    before, indexer_triton.SCORE_GROUP_TOPS = indexer_triton.SCORE_GROUP_TOPS, True
    score_block, tops_given = indexer_triton.pool_score_block, []

    def spy(*args, **kwargs):
        tops_given.append(kwargs.get("tops") is not None)
        return score_block(*args, **kwargs)

    indexer_triton.pool_score_block = spy
    try:
        problems = check_indexer(*case)
    finally:
        indexer_triton.SCORE_GROUP_TOPS, indexer_triton.pool_score_block = before, score_block
    if tops_given and not all(tops_given):
        problems.append(f"the scoring kernel wrote the tops in {sum(tops_given)} of {len(tops_given)} blocks")
    return problems


def check_mhc(rows, cols, logits, dtype, block_rows, block_k, rows_per_program) -> list[str]:
    """The fused mixing-logits kernels (IEEE products; the forward into a NaN-filled output) against the reference
    and autograd of it."""
    gen = torch.Generator().manual_seed(rows * 7 + cols)
    x = (torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4).to(dtype)
    weight = torch.randn(logits, cols, generator=gen) * 0.02
    grad = torch.randn(rows, logits, generator=gen)
    out = torch.full((rows, logits), float("nan"))
    config = mhc_triton.KernelConfig(block_rows=block_rows, block_k=block_k)
    got, rstd = mhc_triton.fused_mixing_logits(x, weight, 1e-6, tf32=False, out=out, config=config)
    expected = mhc_reference.mixing_logits(x, weight, 1e-6)
    # Gradients in fp64 (the truth), so that a bf16 dx differs from them by its own rounding only.
    x64, weight64 = x.double().requires_grad_(), weight.double().requires_grad_()
    exact = torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * (x64 @ weight64.t())
    expected_dx, expected_dw = torch.autograd.grad(exact, (x64, weight64), grad.double())
    problems = [] if got is out and rel_err(got, expected) < 1e-6 else [f"logits rel err {rel_err(got, expected):.2e}"]
    scaled = grad * rstd[:, None]
    coef = rstd.square() / cols * (grad * got).sum(-1)
    backward = mhc_triton.BackwardConfig(rows_per_program=rows_per_program, block_rows=block_rows, block_k=block_k)
    dx, dw = mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=False, config=backward)
    # bf16 streams: Triton 3.9's interpreter truncates fp32 -> bf16 (half the elements differ from round-to-nearest
    # here, 3.2e-3 against fp64 where rounding gives 1.7e-3); the GPU rounds to nearest (tests/gpu/test_mhc_triton.py
    # holds it to 3e-3). Dropping the norm's term from dx costs 5.7e-2 at this shape.
    dx_tolerance = 5e-3 if dtype == torch.bfloat16 else 1e-5
    if dx.dtype != dtype or rel_err(dx, expected_dx) > dx_tolerance:
        problems.append(f"dx rel err {rel_err(dx, expected_dx):.2e} ({dx.dtype})")
    if rel_err(dw, expected_dw) > 1e-5:
        problems.append(f"dweight rel err {rel_err(dw, expected_dw):.2e}")
    op_dx, op_dw = mhc_op.mixing_logits_backward_op(grad, x, weight, got, rstd, False)
    if rel_err(op_dx, dx) > dx_tolerance or rel_err(op_dw, dw) > 1e-5:
        problems.append("the op's torch formulas differ from the kernel")
    return problems


def check_block_input(rows, n, dim, dtype, block_rows, block_k, rows_per_program, merge_share) -> list[str]:
    """The hyper-connection's block input (genolc/model/ops/mhc/op.py ``block_input_forward`` and
    ``block_input_gradients`` on their kernels' path: the weighted sum of the streams, its gradient's reduction, and
    the mixing-logits backward adding the block input's share to x's gradient and, with ``merge_share``, a gradient
    of x from the merge, ``grad_x``) against fp64 autograd of the reference, and against the op's torch formulas."""
    gen = torch.Generator().manual_seed(rows * 11 + n * dim)
    cols, width = n * dim, (2 + n) * n
    x = (torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4).to(dtype)
    weight = torch.randn(width, cols, generator=gen) * 0.05
    scale = torch.rand(3, generator=gen) + 0.5
    base = torch.randn(width, generator=gen) * 0.5
    grad_logits = torch.randn(rows, width, generator=gen)
    grad_block = torch.randn(rows, dim, generator=gen).to(dtype)
    # "strided": the merge's share as a slice of a wider tensor (a row stride other than x's).
    grad_x = (torch.randn(rows, cols + 8 * (merge_share == "strided"), generator=gen)[:, :cols] * 3).to(dtype) \
        if merge_share else None
    logits, rstd, block = mhc_op.block_input_forward(x, weight, scale, base, 1e-6, 1e-6, n, False, kernels=True)
    leaves = [t.double().requires_grad_() for t in (x, weight, scale, base)]
    exact_outputs = mhc_reference.block_input(*leaves, 1e-6, 1e-6, n)
    exact_logits, exact_block = exact_outputs[:2]
    upstream = [grad_logits.double(), grad_block.double()]
    exact = torch.autograd.grad(exact_outputs if merge_share else exact_outputs[:2], leaves,
                                upstream + [grad_x.double()] if merge_share else upstream)
    # bf16: the interpreter truncates fp32 -> bf16 (check_mhc's note), twice the rounding's error.
    tolerance = 8e-3 if dtype == torch.bfloat16 else 1e-5
    problems = []
    if block.dtype != dtype or rel_err(block, exact_block) > tolerance:
        problems.append(f"block input rel err {rel_err(block, exact_block):.2e} ({block.dtype})")
    if rel_err(logits, exact_logits) > 1e-5:
        problems.append(f"logits rel err {rel_err(logits, exact_logits):.2e}")
    config = mhc_triton.BackwardConfig(rows_per_program=rows_per_program, block_rows=block_rows, block_k=block_k)
    grads = mhc_op.block_input_gradients(grad_logits, grad_block, x, weight, scale, base, logits, rstd, 1e-6, False,
                                         grad_x, kernels=True, backward_config=config)
    formulas = mhc_op.block_input_gradients(grad_logits, grad_block, x, weight, scale, base, logits, rstd, 1e-6,
                                            False, grad_x, kernels=False)
    for name, got, written, truth in zip(("dx", "dweight", "dscale", "dbase"), grads, formulas, exact):
        limit = tolerance if name == "dx" else 1e-5
        if got.dtype != written.dtype or rel_err(got, truth) > limit or rel_err(got, written) > limit:
            problems.append(f"{name} rel err {rel_err(got, truth):.2e} (the op's formulas: "
                            f"{rel_err(got, written):.2e}, {got.dtype})")
    return problems


def check_comb(rows, n, iterations) -> list[str]:
    """mHC's mixing-matrix kernels (softmax and Sinkhorn; the forward into a NaN-filled output) against fp64
    autograd of the reference, and the reference's written-out backward against the same."""
    gen = torch.Generator().manual_seed(rows * 5 + n)
    logits = torch.randn(rows, n, n, generator=gen) * 3
    grad = torch.randn(rows, n, n, generator=gen)
    leaf = logits.double().requires_grad_()
    expected = mhc_reference.comb_weights(leaf, iterations, 1e-6)
    (expected_grad,) = torch.autograd.grad(expected, leaf, grad.double())
    out = torch.full_like(logits, float("nan"))
    got = comb_triton.comb_weights(logits, iterations, 1e-6, out=out)
    dlogits = comb_triton.comb_weights_backward(grad, logits, iterations, 1e-6)
    written = mhc_reference.comb_weights_backward(grad.double(), logits.double(), iterations, 1e-6)
    problems = [] if got is out and rel_err(got, expected) < 1e-6 else [f"comb rel err {rel_err(got, expected):.2e}"]
    if rel_err(dlogits, expected_grad) > 1e-5:
        problems.append(f"dlogits rel err {rel_err(dlogits, expected_grad):.2e}")
    if rel_err(written, expected_grad) > 1e-12:
        problems.append(f"the reference's backward rel err {rel_err(written, expected_grad):.2e}")
    return problems


def check_moe(tokens, top_k, dim, inter, dtype, seed) -> list[str]:
    """The routed experts' glue kernels against the ops' torch formulas: rows and columns off the tiles' grid. In
    fp32 they agree to rounding; bf16 outputs differ by up to an ulp, as the interpreter truncates where the GPU
    rounds to nearest (the GPU test holds them to 4e-3)."""
    problems = []
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(tokens * top_k, generator=generator)
    position = moe_op.slot_positions(order)
    hidden = (4.0 * torch.randn(tokens * top_k, 2 * inter, generator=generator)).to(dtype)
    hidden[0, :3] = torch.tensor([7.0, 9.0, -7.0])
    hidden[0, inter: inter + 3] = torch.tensor([7.0, -7.5, 8.0])
    d_act = torch.randn(tokens * top_k, inter, generator=generator).to(dtype)
    rows = torch.randn(tokens * top_k, dim, generator=generator).to(dtype)
    weights = torch.rand(tokens, top_k, generator=generator)
    grad = torch.randn(tokens, dim, generator=generator).to(dtype)
    pairs = {
        "swiglu": (moe_triton.swiglu(hidden, 7.0), moe_op.swiglu_op(hidden, 7.0)),
        "swiglu backward": (moe_triton.swiglu_backward(d_act, hidden, 7.0),
                            moe_op.swiglu_backward_op(d_act, hidden, 7.0)),
        "combine": (moe_triton.combine(rows, position, weights, top_k), moe_op.combine_op(rows, position, weights)),
        "gather backward": (moe_triton.combine(rows, position, None, top_k),
                            moe_op.gather_slots_backward_op(rows, position, top_k)),
    }
    d_rows, d_weights = moe_triton.combine_backward(grad, rows, position, weights)
    expected_rows, expected_weights = moe_op.combine_backward_op(grad, rows, position, weights)
    pairs["combine backward rows"] = (d_rows, expected_rows)
    pairs["combine backward weights"] = (d_weights, expected_weights)
    for name, (got, expected) in pairs.items():
        tolerance = 1e-5 if got.dtype == torch.float32 else 1e-2
        if got.shape != expected.shape or got.dtype != expected.dtype or rel_err(got, expected) > tolerance:
            problems.append(f"{name}: {tuple(got.shape)} {got.dtype} rel err {rel_err(got, expected):.2e}")
    if not torch.equal(pairs["swiglu backward"][0] == 0, pairs["swiglu backward"][1] == 0):
        problems.append("swiglu backward: zero gradients (clamped inputs) at other places")
    return problems


def check_kda_conv(batch, length, channels, taps, dtype, parts, config) -> list[str]:
    """KDA's convolution kernels, forward (``parts`` outputs) and backward (their gradients), into NaN-poisoned
    memory against autograd of the fp64 definition (F.conv1d) and against conv.py's torch code, rows and channels
    off the tiles' grid."""
    gen = torch.Generator().manual_seed(length * 7 + channels)
    padded = torch.randn(batch, length + taps - 1, channels, generator=gen).to(dtype)
    weight = torch.randn(channels, taps, generator=gen) / taps
    grads = [g.contiguous() for g in torch.randn(batch, length, channels, generator=gen).to(dtype).chunk(parts, -1)]
    leaves = padded.double().requires_grad_(), weight.double().requires_grad_()
    exact_out = kda_conv.reference_causal_conv_silu(*leaves)
    expected = torch.autograd.grad(exact_out, leaves, torch.cat(grads, -1).double())
    poisoned = torch.empty_like, torch.Tensor.new_empty
    torch.empty_like = lambda t, **kw: poisoned[0](t, **kw).fill_(float("nan"))
    torch.Tensor.new_empty = lambda t, *a, **kw: poisoned[1](t, *a, **kw).fill_(float("nan"))
    try:
        outs = kda_conv_triton.conv_silu_forward(padded, weight, parts, config)
        got = kda_conv_triton.conv_silu_backward(grads, padded, weight, config)
    finally:
        torch.empty_like, torch.Tensor.new_empty = poisoned
    written = kda_conv.torch_conv_silu_backward(grads, padded, weight)
    problems = []
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    out = torch.cat(outs, -1)
    if len(outs) != parts or not all(o.is_contiguous() and o.dtype == dtype for o in outs) \
            or rel_err(out, exact_out.detach()) > tolerance \
            or rel_err(out, torch.cat(kda_conv.torch_conv_silu_parts(padded, weight, parts), -1)) > tolerance:
        problems.append(f"forward: {len(outs)} parts, rel err {rel_err(out, exact_out.detach()):.2e}")
    for name, mine, want, torch_version in zip(("d_padded", "d_weight"), got, expected, written):
        if mine.dtype != torch_version.dtype or rel_err(mine, want) > tolerance \
                or rel_err(mine, torch_version) > tolerance:
            problems.append(f"{name} {mine.dtype}: rel err {rel_err(mine, want):.2e} (fp64 definition), "
                            f"{rel_err(mine, torch_version):.2e} (torch backward)")
    return problems


MERGE_CASES = [
    # leading dims, N, D, dtype, tokens a program, columns a block: D off the block (masked columns), tokens
    # off the program's rows, one stream, eight streams, bf16, a column block wider than D, transposed inputs,
    # no tokens, no columns (zero inner products)
    ((2, 37), 4, 100, torch.float32, 4, 32),
    ((1, 77), 4, 256, torch.bfloat16, 4, 64),
    ((101,), 1, 48, torch.float32, 2, 16),
    ((1, 13), 8, 40, torch.bfloat16, 1, 64),
    ((3, 5), 2, 24, torch.float32, 8, 128),
    ((2, 9), 4, 33, torch.bfloat16, 4, 32, True),
    ((1, 0), 4, 16, torch.float32, 4, 16),
    ((1, 3), 4, 0, torch.float32, 4, 16),
]
SLAB_ORDER_CASES = [
    (2, 37, 13, 101, 32, "ascending", torch.int32),
    (2, 37, 13, 101, 32, "any", torch.int32),
    (2, 77, 2051, 5000, 512, "ascending", torch.int32),
    (2, 77, 2051, 5000, 512, "any", torch.int64, True),
    (1, 41, 2051, 5000, 512, "mixed", torch.int32),
    (2, 23, 200, 255, 1, "ascending", torch.int64),
    (2, 23, 200, 255, 1, "any", torch.int32),
    (2, 19, 50, 60, 1000, "any", torch.int32),
    (1, 9, 1, 3, 2, "ascending", torch.int32),
]
ROW_DOT_CASES = [
    (2, 37, 8, 256, torch.bfloat16),
    (1, 77, 12, 384, torch.bfloat16),
    (2, 13, 3, 40, torch.float32),
    (1, 5, 1, 1, torch.float16),
]
POOL_MASS_CASES = [
    # batch, length, heads, rank, topk, kpool, index dtype: pools past one slot block, 40 heads (two head
    # blocks), one head, single-token pools, kpool 16, no tail (W = topk)
    (2, 203, 3, 24, 64, 4, torch.int32),
    (1, 101, 40, 20, 32, 4, torch.int64),
    (1, 77, 3, 72, 96, 4, torch.int32),
    (1, 203, 1, 8, 8, 1, torch.int32),
    (2, 203, 2, 32, 64, 16, torch.int64),
]
CONV_CASES = [
    # batch, L, C, K, dtype, parts, config: one row; rows and channels off the tile grid; several segment
    # groups and segments that end past the rows; K = 3 and K = 1 (missing taps); two and three parts
    (1, 1, 5, 4, torch.float32, 1, kda_conv_triton.ConvKernelConfig(segment_rows=4, segments=2,
        block_channels=16)),
    (2, 77, 40, 4, torch.float32, 1, kda_conv_triton.ConvKernelConfig(segment_rows=8, segments=4,
        block_channels=32)),
    (2, 130, 48, 3, torch.bfloat16, 3, kda_conv_triton.ConvKernelConfig(segment_rows=12, segments=2,
        block_channels=16)),
    (1, 57, 16, 1, torch.float32, 2, kda_conv_triton.ConvKernelConfig(segment_rows=4, segments=8,
        block_channels=8)),
    (1, 203, 130, 4, torch.bfloat16, 1, kda_conv_triton.DEFAULT_CONFIG),
    (1, 203, 384, 4, torch.bfloat16, 3, kda_conv_triton.DEFAULT_CONFIG),
]
MOE_CASES = [
    # tokens, K, D, I, dtype, seed: one token; rows off the 16-row tile; D and I off the 256-column step
    (1, 1, 40, 24, torch.float32, 0),
    (37, 2, 300, 200, torch.float32, 1),
    (37, 2, 300, 200, torch.bfloat16, 1),
    (21, 4, 512, 256, torch.bfloat16, 2),
]
INDEXER_CASES = [
    # batch, length, heads, dim, topk, kpool, tail, dtype, query_chunk, out_dtype
    (2, 37, 3, 24, 16, 4, True, torch.float32, None, torch.int64),
    (2, 203, 3, 24, 32, 4, True, torch.float32, 64, torch.int32),
    (2, 203, 4, 16, 64, 16, True, torch.float32, 50, torch.int64),
    (2, 203, 2, 16, 32, 16, False, torch.float32, None, torch.int64),
    (1, 203, 2, 32, 8, 1, False, torch.float32, 70, torch.int64),
    (2, 37, 2, 16, 16, 16, True, torch.float32, None, torch.int64),
    # [, offset]: the queries of one chunk of a window (offsets off the pool grid and the query-chunk grid)
    (2, 203, 3, 24, 32, 4, True, torch.float32, 64, torch.int32, 97),
    (1, 203, 2, 16, 32, 16, False, torch.float32, None, torch.int64, 130),
]
DSA_CASES = [
    # batch, length, heads, rank, topk, kpool, index dtype[, strided indices]
    (2, 37, 3, 24, 16, 4, torch.int64),
    (2, 203, 2, 32, 64, 4, torch.int32),
    (2, 203, 12, 48, 64, 16, torch.int64, True),
    (1, 203, 1, 8, 8, 1, torch.int32),
    (2, 37, 2, 16, 16, 16, torch.int64),
    (1, 101, 40, 20, 32, 4, torch.int32),       # 40 heads: two head blocks, the second partly padded
    (1, 77, 3, 72, 96, 4, torch.int64),         # W = 99 > one slot block; R = 72 pads to 128
]
MHC_CASES = [
    # rows, K, logits, x dtype, block rows, block K, backward rows per program: rows and K off the tile grid,
    # one row, W not a power of 2, several row groups with a partial last one
    (37, 96, 24, torch.float32, 16, 32, 16),
    (203, 200, 24, torch.float32, 64, 64, 128),
    (1, 72, 24, torch.float32, 16, 64, 32),
    (77, 128, 40, torch.bfloat16, 32, 32, 32),
]
INDEXER_KL_CASES = [
    # batch, rows, heads, dim, pools in the window, pool slots a row, kpool, empty slots' share, query dtype, index
    # dtype, strided operands, a common score offset: the presets' 8 heads of 64 (kpool 4), a head count and width
    # off the tiles (3 of 20), slots off the 32-slot block (37, 70, 130), more slots than pools (pools chosen twice),
    # kpool 1 and 16, bf16 queries (loaded and taken to fp32, no bf16 product under the interpreter), the kernels'
    # largest 16 heads of 128, scores around 1e3 and 1e4
    (2, 7, 8, 64, 50, 37, 4, 0.2, torch.float32, torch.int64, False, 0.0),
    (1, 5, 3, 20, 9, 70, 1, 0.5, torch.float32, torch.int32, True, 0.0),
    (1, 33, 8, 64, 300, 130, 4, 0.05, torch.bfloat16, torch.int32, False, 0.0),
    (3, 4, 16, 128, 64, 64, 16, 0.0, torch.float32, torch.int64, True, 0.0),
    (1, 9, 8, 64, 200, 40, 4, 0.1, torch.float32, torch.int32, True, 1e3),
    (1, 9, 8, 64, 200, 40, 4, 0.1, torch.float32, torch.int32, False, 1e4),
]
BLOCK_INPUT_CASES = [
    # rows, N, D, x dtype, block rows, block K, backward rows per program, the merge's share of x's gradient (or a
    # strided one): a
    # stream's columns ending inside a column tile (D = 24, 40 against tiles of 32, 64), rows off the tiles, one row,
    # two streams, D past the weighted sum's 256-column block, several row groups with a partial last one
    (37, 4, 24, torch.float32, 16, 32, 16, False),
    (37, 4, 24, torch.float32, 16, 32, 16, True),
    (203, 4, 64, torch.float32, 64, 64, 128, True),
    (1, 2, 40, torch.float32, 16, 64, 32, True),
    (77, 4, 32, torch.bfloat16, 32, 32, 32, True),
    (77, 4, 32, torch.bfloat16, 32, 32, 32, False),
    (45, 4, 300, torch.float32, 32, 64, 64, False),
    (53, 4, 64, torch.bfloat16, 16, 64, 32, "strided"),
]
COMB_CASES = [
    # rows, N, Sinkhorn iterations: rows off the 64-token block, N off a power of two (its padding's gradient
    # grew by 1 / eps a step until it overflowed at 20 iterations, on the H200), one iteration
    (37, 4, 20),
    (130, 4, 20),
    (5, 3, 20),
    (9, 2, 1),
]
TOP_POOLS_CASES = [
    # rows, cols, first query, kpool, keep: rows that see fewer pools than keep beside rows that see more,
    # keep not a power of two, rows past the block's columns, candidates over their 1024 slots, two segments
    (24, 300, 180, 4, 48),
    (9, 3001, 11990, 4, 64),
    (5, 2500, 2600, 1, 100),
    (2, 20000, 79990, 4, 64),
]


SCORE_TOPS_CASES = [
    # rows, pools, first query, keep, heads, dim: two segments of 16,384 pools at the presets' keep, rows past the
    # block's columns; rows that see fewer pools than keep beside rows that see more; ties (ReLU zeros); a dim off
    # the tiles
    (6, 20000, 79990, 512, 2, 16),
    (24, 300, 180, 48, 1, 16),
    (7, 3001, 11990, 64, 3, 24),
]


# Each group: its name (an argument that runs it alone), its check, its cases, how much of a case a report line
# shows (None: all of it).
def case_groups() -> list[tuple[str, object, list[tuple], int | None]]:
    return [("merge", check_merge, MERGE_CASES, None), ("pool_mass", check_pool_mass, POOL_MASS_CASES, None),
            ("slab_order", check_slab_order, SLAB_ORDER_CASES, None), ("row_dot", check_row_dot, ROW_DOT_CASES, None),
            ("conv", check_kda_conv, CONV_CASES, 6), ("moe", check_moe, MOE_CASES, None),
            ("mhc", check_mhc, MHC_CASES, None), ("block_input", check_block_input, BLOCK_INPUT_CASES, None),
            ("comb", check_comb, COMB_CASES, None), ("indexer_kl", check_indexer_kl, INDEXER_KL_CASES, None),
            ("top_pools", check_top_pools, TOP_POOLS_CASES, None),
            ("score_tops", check_score_tops, SCORE_TOPS_CASES, None),
            ("indexer_score_tops", check_indexer_score_tops, INDEXER_CASES[:2] + INDEXER_CASES[-2:], None),
            ("indexer", check_indexer, INDEXER_CASES, None),
            ("dsa", check_dsa, DSA_CASES, None)]


def main() -> int:
    groups = case_groups()
    names = [name for name, *_ in groups]
    chosen = sys.argv[1:] or names
    unknown = [name for name in chosen if name not in names]
    if unknown:
        sys.exit(f"unknown group {', '.join(unknown)}: choose from {', '.join(names)} (none: all of them)")
    failures = 0
    for name, check, cases, shown in groups:
        if name not in chosen:
            continue
        for case in cases:
            start = time.time()
            problems = check(*case)
            failures += bool(problems)
            print(f"{name} {case[:shown]}: {'FAIL ' + '; '.join(problems) if problems else 'ok'} "
                  f"({time.time() - start:.1f}s)")
    print("all ok" if failures == 0 else f"{failures} case(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
