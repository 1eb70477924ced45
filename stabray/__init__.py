"""stabray: sweeps that measure and control the stability of multi-step reasoning.

The error amplification factor (EAF) of Li et al. 2026 (eq. 4), Algorithm 1 (CoT compression +
quantization-aware training) and its baselines, wrapped as Ray Tune trainables and searched with
Optuna, every trial tracked in MLflow.
"""

__version__ = "0.1.0"
