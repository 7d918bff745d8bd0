"""The LSP task-volume forecast of RLPTO (Lu et al., IEEE TPDS 34(12), 2023, §IV).

Tomorrow's task volume is ``alpha * GRU(last 7 days) + (1 - alpha) * ARIMA(history)``
(ARIMA alone without GRU weights), one node's load an exponentially weighted average,
and the recommended node count their ratio, rounded up: a recommendation only.
Pure numpy + statsmodels. Formulas: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from . import nn

__all__ = ["ewma", "combine", "recommended_nodes", "arima_forecast", "GRUForecaster", "Forecast", "LSPForecast"]

log = logging.getLogger(__name__)


def ewma(values: Sequence[float], rho: float = 0.8) -> float:
    """EWMA of ``values`` (oldest first): ``s_0 = v_0``, ``s_t = rho*s_{t-1} + (1-rho)*v_t``."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must lie in [0, 1], got {rho}")
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("ewma of an empty sequence")
    s = float(v[0])
    for x in v[1:]:
        s = rho * s + (1.0 - rho) * float(x)
    return s


def combine(gru: float | None, arima: float, alpha: float = 0.6) -> float:
    """``alpha*gru + (1-alpha)*arima``, or ``arima`` when there is no GRU estimate."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if gru is None:
        return float(arima)
    return alpha * float(gru) + (1.0 - alpha) * float(arima)


def recommended_nodes(volume: float, tasks_per_node: float, minimum: int = 0) -> int:
    """Nodes needed to carry ``volume`` tasks at ``tasks_per_node`` each (rounded up)."""
    if tasks_per_node <= 0:
        raise ValueError(f"tasks_per_node must be > 0, got {tasks_per_node}")
    return max(minimum, int(math.ceil(max(volume, 0.0) / tasks_per_node - 1e-9)))


def arima_forecast(history: Sequence[float], order: tuple[int, int, int] = (1, 1, 1)) -> float:
    """One-step-ahead ARIMA forecast of a daily series (statsmodels).

    Histories too short for ``order`` (fewer than ``p + d + q + 3`` points) fall back to
    the mean of the last three values; the fallback is logged.
    """
    y = np.asarray(history, dtype=float)
    if y.size == 0:
        raise ValueError("ARIMA needs at least one observation")
    if not np.all(np.isfinite(y)):
        raise ValueError("history contains NaN or inf")
    if y.size < sum(order) + 3 or np.ptp(y) == 0:
        log.info("ARIMA%s: %d points is too short or constant, using the recent mean", order, y.size)
        return float(y[-3:].mean())
    from statsmodels.tsa.arima.model import ARIMA  # heavy import, only when used

    with warnings.catch_warnings():
        # statsmodels warns about convergence/frequency on small series; the result is
        # still the maximum-likelihood fit and we only want its point forecast
        warnings.simplefilter("ignore")
        fit = ARIMA(y, order=order).fit()
        return float(np.asarray(fit.forecast(1))[0])


class GRUForecaster:
    """``nn.GRU`` over the last ``window`` daily volumes plus a linear head, in numpy.

    ``weights`` in PyTorch names: ``{gru_prefix}weight_ih_l{k}`` ... and
    ``{head_prefix}weight`` ``[1, hidden]``, ``{head_prefix}bias``. Inputs are
    normalised with ``(y - mean) / std`` and the output de-normalised.
    """

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        *,
        mean: float = 0.0,
        std: float = 1.0,
        window: int = 7,
        gru_prefix: str = "gru.",
        head_prefix: str = "head.",
    ) -> None:
        if f"{gru_prefix}weight_hh_l0" not in weights or f"{head_prefix}weight" not in weights:
            raise ValueError(
                f"GRU weights need {gru_prefix}weight_hh_l0 and {head_prefix}weight; got {sorted(weights)}"
            )
        if std <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        self.weights = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        self.layers = sum(1 for k in weights if k.startswith(f"{gru_prefix}weight_ih_l"))
        self.mean, self.std, self.window = float(mean), float(std), int(window)
        self.gru_prefix, self.head_prefix = gru_prefix, head_prefix

    @classmethod
    def from_file(cls, path: str | Path) -> "GRUForecaster":
        """Read a ``.safetensors`` + ``.json`` pair (metadata keys ``mean``, ``std``, ``window``)."""
        weights, meta = nn.load_policy_file(path)
        return cls(weights, mean=meta.get("mean", 0.0), std=meta.get("std", 1.0), window=meta.get("window", 7))

    def predict(self, last: Sequence[float]) -> float:
        x = np.asarray(last, dtype=np.float64)[-self.window :]
        if x.size < self.window:
            raise ValueError(f"GRU needs the last {self.window} days, got {x.size}")
        z = ((x - self.mean) / self.std).reshape(1, -1, 1)
        _, h = nn.gru(z, self.weights, self.layers, prefix=self.gru_prefix)
        out = nn.linear(h[-1], self.weights[f"{self.head_prefix}weight"], self.weights.get(f"{self.head_prefix}bias"))
        return float(out.reshape(-1)[0]) * self.std + self.mean


@dataclass(frozen=True, slots=True)
class Forecast:
    volume: float
    arima: float
    gru: float | None
    tasks_per_node: float
    nodes: int

    @property
    def used_gru(self) -> bool:
        return self.gru is not None


class LSPForecast:
    """RLPTO's LSP: task volume forecast and the node count it implies."""

    def __init__(
        self,
        *,
        alpha: float = 0.6,
        rho: float = 0.8,
        order: tuple[int, int, int] = (1, 1, 1),
        gru: GRUForecaster | None = None,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"rho must lie in [0, 1], got {rho}")
        self.alpha, self.rho, self.order, self.gru = alpha, rho, order, gru

    def forecast(self, daily_volume: Sequence[float], tasks_per_node: Sequence[float]) -> Forecast:
        """Forecast from the daily task volumes (oldest first) and the observed tasks per
        node (oldest first)."""
        ar = arima_forecast(daily_volume, self.order)
        g = None
        if self.gru is not None and len(daily_volume) >= self.gru.window:
            g = self.gru.predict(daily_volume)
        elif self.gru is None:
            log.info("LSP forecast: no GRU weights configured, ARIMA only")
        else:
            log.info("LSP forecast: %d days < GRU window %d, ARIMA only", len(daily_volume), self.gru.window)
        y = combine(g, ar, self.alpha)
        t = ewma(tasks_per_node, self.rho)
        return Forecast(volume=y, arima=ar, gru=g, tasks_per_node=t, nodes=recommended_nodes(y, t))
