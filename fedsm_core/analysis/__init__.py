"""Scoring trained models on held-out data: per-image Dice, calibration, familiarity, pooled training."""
