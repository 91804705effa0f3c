"""Polynomial forecasting of features from the last fully computed denoising steps.

Features of a diffusion transformer move smoothly along the sampling trajectory, so a skipped
step's features are better *forecast* from the last few full steps than reused as they are.
The forecast here is the interpolating polynomial through the last ``order + 1`` full steps,
evaluated at the current timestep: order 0 is plain reuse (as in First Block Cache), order 1 a
linear extrapolation, order 2 a quadratic one.

Source: the idea of forecasting cached features with a low-order Taylor expansion in the
timestep is TaylorSeer (Liu et al., "From Reusing to Forecasting: Accelerating Diffusion
Models with TaylorSeers", ICCV 2025); TaylorSeer uses finite differences over evenly spaced
steps, here the polynomial in the actual timestep so that uneven (shifted) schedules and
skipped steps are handled exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def forecast(times: Sequence[float], values: Sequence[torch.Tensor], at: float,
             order: int) -> torch.Tensor:
    """Extrapolates ``values`` (features at ``times``) to time ``at``.

    Args:
        times: the timesteps of the last full steps, oldest first (any unit, e.g. the
            scheduler's 0..1000 timestep); must be distinct.
        values: tensors of one shape and dtype, one per time, oldest first.
        at: the timestep to forecast.
        order: polynomial order; the last ``min(order, len(times) - 1)`` + 1 points are used.

    Returns:
        A tensor of the values' shape and dtype (computed in float32).

    Raises:
        ValueError: no values, or times and values of different lengths.
    """
    if not values or len(times) != len(values):
        raise ValueError(f"forecast: need as many times as values (got {len(times)} times, "
                         f"{len(values)} values)")
    k = max(0, min(order, len(values) - 1))
    if k == 0:
        return values[-1]
    ts = [float(t) for t in times[-(k + 1):]]
    # the interpolating polynomial in Lagrange form: p(at) = sum_i w_i y_i, with the scalar
    # weights computed here, so a forecast costs k + 1 tensor operations whatever the order
    # (the same polynomial as Newton's form; a skipped call's cost is mostly these ops)
    weights = []
    for i, ti in enumerate(ts):
        w = 1.0
        for j, tj in enumerate(ts):
            if j != i:
                w *= (at - tj) / (ti - tj)
        weights.append(w)
    ys = values[-(k + 1):]
    result = ys[-1].float() * weights[-1]
    for w, y in zip(weights[:-1], ys[:-1], strict=True):
        result = result.add(y.float(), alpha=w)
    return result.to(values[-1].dtype)
