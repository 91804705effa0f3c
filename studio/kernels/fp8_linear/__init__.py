"""fp8 linear with row-wise scales: one-pass per-token activation quantization + cuBLASLt."""

from .op import LAUNCHES, fp8_linear, quantize_rows_fp8, quantize_weight_fp8
from .reference import fp8_linear_reference, quantize_rows_fp8_reference

__all__ = ["LAUNCHES", "fp8_linear", "fp8_linear_reference", "quantize_rows_fp8",
           "quantize_rows_fp8_reference", "quantize_weight_fp8"]
