"""Personalization methods as FedSM's personalized-model trainer (FT, APFL, Ditto, Per-FedAvg, pFedMe).

The global model and the selector are trained as in FedSM; these methods change
only how site ``k``'s personalized model is trained on the site and folded in on
the server. :mod:`.registry` maps the run-config names to them.
"""
