"""Stability measurement (paper §3.1, Appendix B): per-step input-Jacobian spectral norms, rho,
the error amplification factor (EAF), the eq. (4) decomposition and weight-noise stability."""

from stabray.stability.jacobian import (EAFResult, EAFTracker, eaf_from_norms, estimate_eaf,
                                        estimate_eaf_loop, rho_matrix)

__all__ = ["EAFResult", "EAFTracker", "eaf_from_norms", "estimate_eaf", "estimate_eaf_loop", "rho_matrix"]
