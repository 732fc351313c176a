"""FedSM: the global and personalized models, SoftPull, the model selector and the super model."""
