"""Flower ClientApp: decodes messages, runs fedsm_core on the local site, encodes replies."""
