"""The `obmm-testbed` command line: every verb, one registry (main.py).  Kept free of imports."""
