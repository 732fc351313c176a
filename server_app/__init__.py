"""Flower ServerApp: holds the FedSM super model, drives rounds, writes the run folder."""
