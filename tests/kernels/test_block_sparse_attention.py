"""studio.kernels.block_sparse_attention: the video block mask against a dense token-level
mask, the compact layout, and the kernel (under Triton's interpreter) against dense masked
attention, with a visit counter proving dropped blocks are skipped."""

from __future__ import annotations

import pytest
import torch

from studio.kernels.block_sparse_attention import (
    LAUNCHES,
    BlockSparseLayout,
    block_sparse_attention,
    block_sparse_attention_reference,
    build_video_mask,
)
from studio.kernels.block_sparse_attention.op import block_sparse_attention_fwd
from studio.kernels.block_sparse_attention.reference import block_reduce, video_token_mask

from .helpers import assert_close, launches, poisoned

LAYOUTS = [  # frames, height, width, text_len, block_m, block_n, window
    (3, 5, 7, 11, 16, 32, (1, 1, 2)),
    (2, 4, 9, 0, 16, 16, (0, 1, 1)),
    (5, 3, 4, 20, 32, 16, (2, 0, 3)),
    (4, 6, 6, 77, 16, 16, (1, 2, 2)),
    (1, 1, 1, 5, 16, 16, (0, 0, 0)),
    (3, 8, 8, 13, 64, 32, (5, 9, 9)),  # window larger than the grid
    (6, 4, 8, 3, 32, 64, (0, 0, 0)),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_video_mask_matches_the_dense_token_mask(layout):
    frames, height, width, text_len, block_m, block_n, window = layout
    mask = build_video_mask(frames, height, width, text_len, block_m, block_n, window)
    expected = block_reduce(video_token_mask(frames, height, width, text_len, window),
                            block_m, block_n)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("layout,sink", [(LAYOUTS[0], 1), (LAYOUTS[2], 2), (LAYOUTS[6], 1),
                                         (LAYOUTS[1], 2)], ids=str)
def test_sink_frames_are_seen_by_every_query(layout, sink):
    frames, height, width, text_len, block_m, block_n, window = layout
    mask = build_video_mask(frames, height, width, text_len, block_m, block_n, window,
                            sink_frames=sink)
    expected = block_reduce(video_token_mask(frames, height, width, text_len, window, sink),
                            block_m, block_n)
    assert torch.equal(mask, expected)
    assert mask[:, 0].all()  # the first key block holds sink tokens
    with pytest.raises(ValueError, match="sink_frames"):
        build_video_mask(frames, height, width, text_len, block_m, block_n, window,
                         sink_frames=frames + 1)


def test_video_mask_is_sparse_for_real_video_shapes():
    # Wan 2.1 480p, 21 latent frames: a small local window keeps a few percent of the blocks.
    mask = build_video_mask(21, 30, 52, 0, 128, 128, window=(1, 2, 2))
    assert mask.shape == (256, 256)  # 21·30·52 = 32760 tokens
    assert 0.01 < mask.float().mean() < 0.1
    assert mask.diagonal().all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(frames=0), r"^frames must be a positive int, got 0"),
    (dict(text_len=-1), r"^text_len must be an int >= 0, got -1"),
    (dict(block_m=24), r"^block_m must be one of 16, 32, 64, 128, got 24"),
    (dict(window=(1, 1)), r"^window must be three ints >= 0"),
    (dict(window=(1, -1, 1)), r"^window must be three ints >= 0"),
])
def test_video_mask_checks(kwargs, match):
    args = dict(frames=2, height=3, width=4, text_len=5, block_m=16, block_n=16,
                window=(1, 1, 1))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build_video_mask(**args)


def test_layout_lists_kept_blocks_in_order():
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    layout = BlockSparseLayout.from_mask(mask, 16, 32)
    assert layout.kv_counts.tolist() == [3, 0, 1]
    assert layout.kv_indices.dtype == torch.int32 and layout.kv_indices.shape == (3, 3)
    assert layout.kv_indices[0].tolist() == [0, 2, 3] and layout.kv_indices[2, 0] == 1
    assert layout.density() == pytest.approx(4 / 12)
    with pytest.raises(ValueError, match=r"^mask must be a 2-D bool tensor"):
        BlockSparseLayout.from_mask(mask.int(), 16, 32)


@pytest.mark.parametrize("dtype,head_dim,blocks", [
    (torch.float32, 32, (16, 32)),
    (torch.float16, 64, (32, 16)),
    (torch.bfloat16, 128, (32, 32)),
], ids=str)
def test_kernel_matches_dense_masked_attention_and_visits_only_kept_blocks(dtype, head_dim,
                                                                          blocks):
    block_m, block_n = blocks
    frames, height, width, text_len = 4, 4, 8, 17  # 128 video + 17 text tokens
    mask = build_video_mask(frames, height, width, text_len, block_m, block_n, (0, 1, 1))
    layout = BlockSparseLayout.from_mask(mask, block_m, block_n)
    assert not mask.all()
    seq = frames * height * width + text_len
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, seq, head_dim, generator=g).to(dtype) for _ in range(3))
    out, lse = poisoned(q.shape, dtype), poisoned((2, 3, seq))
    visits = torch.zeros(mask.shape[0], dtype=torch.int32)
    with launches(LAUNCHES):
        block_sparse_attention(q, k, v, layout, out=out, lse=lse, visit_counter=visits)
    assert torch.equal(visits, 2 * 3 * layout.kv_counts)
    assert int(visits.sum()) == 2 * 3 * int(mask.sum())
    ref_out, ref_lse = block_sparse_attention_reference(q, k, v, mask, block_m, block_n)
    assert_close(out, ref_out, dtype)
    assert_close(lse, ref_lse, torch.float32)


def test_query_block_without_kept_keys_gives_zero_and_minus_inf():
    mask = torch.tensor([[1, 0], [0, 0], [0, 1]], dtype=torch.bool)  # seq 40, blocks 16 / 32
    layout = BlockSparseLayout.from_mask(mask, 16, 32)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))
    out = poisoned(q.shape)
    with launches(LAUNCHES):
        _, lse = block_sparse_attention(q, k, v, layout, out=out)
    assert torch.equal(out[:, :, 16:32], torch.zeros(1, 2, 16, 32))
    assert torch.isneginf(lse[:, :, 16:32]).all()
    assert_close(out, block_sparse_attention_reference(q, k, v, mask, 16, 32)[0], torch.float32)


def test_layout_must_fit_the_sequence():
    layout = BlockSparseLayout.from_mask(torch.ones(2, 2, dtype=torch.bool), 16, 16)
    q = torch.randn(1, 1, 40, 32)
    with pytest.raises(ValueError, match=r"^layout must have \(cdiv\(seq_q, block_m\)"):
        block_sparse_attention(q, q, q, layout)
    with pytest.raises(ValueError, match=r"^visit_counter\.dtype must be int32"):
        block_sparse_attention(q[:, :, :32], q[:, :, :32], q[:, :, :32], layout,
                               visit_counter=torch.zeros(2))


def test_custom_op_passes_opcheck():
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    layout = BlockSparseLayout.from_mask(mask, 16, 16)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 30, 32, generator=g) for _ in range(3))
    torch.library.opcheck(block_sparse_attention_fwd, (
        q, k, v, mask, layout.kv_indices, layout.kv_counts, 16, 16, 0.2, torch.empty_like(q),
        torch.empty(1, 2, 30), torch.zeros(2, dtype=torch.int32)))
