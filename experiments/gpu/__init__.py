"""The GPU check: what a lent GPU machine runs, samples and reports."""
