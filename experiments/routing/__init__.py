"""Routing studies: the super model routed per image or per case."""
