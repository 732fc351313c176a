"""kNN-Per: a global model combined with a per-site nearest-neighbour datastore."""
