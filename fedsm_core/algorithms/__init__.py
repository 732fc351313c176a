"""Federated algorithms on plain weight dictionaries (name -> numpy array)."""
