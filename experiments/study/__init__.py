"""The resumable reference study: a plan of datasets x methods x seeds, its runs, and its table."""
