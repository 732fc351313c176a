"""The baselines FedSM is compared with: FedProx, SCAFFOLD, FedBN and HarmoFL."""
