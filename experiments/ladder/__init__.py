"""The generalization-gap ladder: the same training as one site, IID sites and the real sites, beside centralized."""
