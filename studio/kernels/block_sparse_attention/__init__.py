"""Block-sparse attention over local video windows plus text (see README.md)."""

from .mask import BlockSparseLayout, build_video_mask
from .op import LAUNCHES, block_sparse_attention
from .reference import block_sparse_attention_reference

__all__ = ["LAUNCHES", "BlockSparseLayout", "block_sparse_attention",
           "block_sparse_attention_reference", "build_video_mask"]
