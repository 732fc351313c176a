"""The robustness study: every simulated attack against every aggregation (``run_robustness``, ``table``)."""
