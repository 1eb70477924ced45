"""Stability measurement (paper §3.1, Appendix B): per-step input-Jacobian spectral norms, rho,
the error amplification factor (EAF), the eq. (4) decomposition and weight-noise stability.

During training (every epoch), with one tracker kept for the trial and a fixed evaluation subset:
    tracker = EAFTracker()
    eaf = estimate_eaf(model, encoded_subset, tracker=tracker).eaf
At the end:
    rows = decompose(model, encoder, test_examples)          # Table 2 rows, keys ROW_KEYS
    noise = weight_noise_stability(model, lambda m: inference_loss(m, encoder, test_examples))
"""

from stabray.stability.decomposition import ROW_KEYS, decompose, inference_loss, weight_noise_stability
from stabray.stability.jacobian import (
    EAFResult,
    EAFTracker,
    eaf_from_norms,
    estimate_eaf,
    estimate_eaf_loop,
    rho_matrix,
)

__all__ = [
    "ROW_KEYS",
    "EAFResult",
    "EAFTracker",
    "decompose",
    "eaf_from_norms",
    "estimate_eaf",
    "estimate_eaf_loop",
    "inference_loss",
    "rho_matrix",
    "weight_noise_stability",
]
