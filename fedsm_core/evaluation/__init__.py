"""Scoring the models of a run on one site's images (what every evaluation round reports)."""
