"""Speed, memory and traffic benchmarks of a run, and their report."""
