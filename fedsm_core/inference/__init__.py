"""Applying a saved model to new images: ``fedsm predict``, its outputs, letterboxing."""
