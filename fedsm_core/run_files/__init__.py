"""What a run leaves on disk: run outputs (metrics, summary), checkpoints, model files and bundles."""
