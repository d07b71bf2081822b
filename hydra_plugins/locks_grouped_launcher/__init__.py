"""The grouped launchers of the LOCKS harness (grouped_launcher.py)."""
