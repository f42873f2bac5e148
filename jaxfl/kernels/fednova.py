"""FedNova's normalised averaging (Wang et al., NeurIPS 2020): coefficients from local step counts.

An aggregation Σ_i c_i Δ_i over updates of τ_i local steps becomes::

    τ_eff = Σ_i c_i τ_i / Σ_i c_i
    Σ_i c_i' Δ_i  with  c_i' = c_i · τ_eff / τ_i        # = τ_eff · Σ_i c_i (Δ_i / τ_i)

so every update counts per local step (a client that ran 4× the steps no longer pulls 4× as hard)
and the total step length stays that of an average client. Σ c_i' = Σ c_i only when all τ_i are
equal; with equal τ_i the coefficients are unchanged (FedNova = FedAvg).

Plain arithmetic: works on Python floats, NumPy or JAX arrays (the engine applies it to the host-side
coefficients of an aggregation before the on-device weighted sum).

>>> [round(c, 6) for c in fednova_coefficients([0.5, 0.5], [10, 40])]      # τ_eff = 25
[1.25, 0.3125]
"""
from __future__ import annotations

import numpy as np


def fednova_coefficients(coefficients, steps):
    """c_i · τ_eff / τ_i (see the module docstring); τ_i < 1 counts as 1 and Σ c_i = 0 is returned as is."""
    c = np.asarray(coefficients, dtype=np.float64)
    tau = np.maximum(np.asarray(steps, dtype=np.float64), 1.0)
    total = c.sum()
    if total == 0:
        return c.tolist()
    tau_eff = float(np.sum(c * tau) / total)
    return (c * tau_eff / tau).tolist()
