"""The ``fedsm`` command, the settings check before a run, and simulation resources."""
