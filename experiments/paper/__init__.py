"""The paper's tables and figures.

Method comparison (Table 3), personalization (Tables 6-7), the selector and super-model
ablations, held-out sites, and tuning on validation.
"""
